// The OCI registry down while the Secret asks for a file from an image (imageRef) that is not cached yet:
// the apply fails without touching a unit, is retried with backoff, and succeeds once the registry is back,
// without a further Secret change.
import type { Scenario } from "../scenario.ts";
import { waitApplied } from "../../harness/agent.ts";
import { pushImage, upstream } from "../../harness/bare-node.ts";
import { waitFor } from "../../harness/exec.ts";
import { agentJournal, iterate, maxFigures, startRig, toolPath, unitRestarts, unitStates, waitAgentReady } from "../lib-control-plane.ts";

export const scenario: Scenario = {
  id: "registry-down",
  fault: "OCI registry down with an imageRef pending",
  async run({ long, log }) {
    const outageMs = long ? 2 * 60_000 : 15_000;
    const iterations = 1;
    const rig = await startRig({ prefix: "cp-reg", registry: true });
    const registry = rig.registry;
    if (!registry) throw new Error("the rig has no registry");
    const figures: Record<string, number>[] = [];
    try {
      const result = await iterate(iterations, log, async (i) => {
        const problems: string[] = [];
        const tag = `v${i}`;
        await pushImage(registry, "chaos/tool", tag, { tool: { content: `tool ${tag}\n`, mode: 0o755 } });
        const before = await unitStates(rig.node);
        await registry.down();
        const downAt = Date.now();
        const checksum = await rig.putOsc(`registry-${i}`, { image: `${upstream}/chaos/tool:${tag}` });
        log(`iteration ${i}: registry down for ${outageMs / 1000} s with ${upstream}/chaos/tool:${tag} pending`);
        await waitFor("the agent's failed apply", async () => (await agentJournal(rig.node, downAt)).includes(`chaos/tool:${tag}`), 30_000, 500);
        await Bun.sleep(Math.max(0, outageMs - (Date.now() - downAt)));
        await registry.up();
        const upAt = performance.now();
        await waitApplied(rig.agent, checksum, 6 * 60_000, 250);
        const appliedMs = Math.round(performance.now() - upAt);
        const tool = (await rig.node.readFile(toolPath)).trim();
        if (tool !== `tool ${tag}`) problems.push(`${toolPath} holds ${JSON.stringify(tool)}`);
        const readyMs = await waitAgentReady(rig, 30_000);
        problems.push(...unitRestarts(before, await unitStates(rig.node)).map((r) => `unexpected restart: ${r}`));
        figures.push({ appliedAfterRegistryBackMs: appliedMs, readyMs });
        log(`iteration ${i}: ${JSON.stringify(figures.at(-1))}`);
        return problems;
      });
      return { checked: "the failed apply touched no unit, was retried and applied once the registry was back (no further Secret change), /readyz 200", iterations, ...result, figures: maxFigures(figures) };
    } finally {
      await rig.stop();
    }
  },
};
