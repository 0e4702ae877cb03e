// The Bun plugin that points @kubernetes/client-node's `from 'undici'` at ./undici-bun.ts.
// It must be an onLoad rewrite: Bun never calls onResolve for a specifier it has a built-in for.
import type { BunPlugin } from "bun";

const shim = new URL("./undici-bun.ts", import.meta.url).pathname;
const clientNodeDist = /[\\/]@kubernetes[\\/]client-node[\\/]dist[\\/].*\.js$/;

export function undiciShim(stats: { rewritten: number } = { rewritten: 0 }): BunPlugin {
  return {
    name: "k8s-undici-shim",
    setup(build) {
      build.onLoad({ filter: clientNodeDist }, async (args) => {
        const src = await Bun.file(args.path).text();
        if (!src.includes("from 'undici'")) return { contents: src, loader: "js" };
        stats.rewritten++;
        return { contents: src.replaceAll("from 'undici'", `from ${JSON.stringify(shim)}`), loader: "js" };
      });
    },
  };
}
