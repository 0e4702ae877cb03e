// The Bun plugin that points @kubernetes/client-node's `from 'undici'` at ./undici-bun.ts, for `bun test`
// (preload.ts): the tests use client-node's own clients (the cluster's admin, RBAC probes), whose TLS
// settings Bun's built-in undici would drop. The agent does not send requests through client-node
// (src/kube/client.ts), so the compiled binary needs no such rewrite.
// It must be an onLoad rewrite: Bun never calls onResolve for a specifier it has a built-in for.
import type { BunPlugin } from "bun";

const shim = new URL("./undici-bun.ts", import.meta.url).pathname;
const clientNodeDist = /[\\/]@kubernetes[\\/]client-node[\\/]dist[\\/].*\.js$/;

export function undiciShim(): BunPlugin {
  return {
    name: "k8s-undici-shim",
    setup(build) {
      build.onLoad({ filter: clientNodeDist }, async (args) => {
        const src = await Bun.file(args.path).text();
        if (!src.includes("from 'undici'")) return { contents: src, loader: "js" };
        return { contents: src.replaceAll("from 'undici'", `from ${JSON.stringify(shim)}`), loader: "js" };
      });
    },
  };
}
