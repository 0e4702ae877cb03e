// The disk full under a target directory: a small tmpfs mounted in the node at a directory the OSC writes
// to, filled up by another file just before an update that writes there. The apply stops at that file
// with a clear error (log line, Warning event naming it) and changes nothing else; it is retried, and
// converges once the space is freed.
import { CoreV1Api } from "@kubernetes/client-node";
import { waitFor } from "../../harness/exec.ts";
import { agentLogLines, chaosOsc, differences, faultClock, fullDir, lookAtNode, spread, startRig, unexpectedStarts } from "../lib-node.ts";
import type { Scenario } from "../scenario.ts";

const fullFiles = 4;
const filler = `${fullDir}/filler`;
const page = 4096;

export const scenario: Scenario = {
  id: "disk-full",
  fault: "the disk full under a target directory",
  async run({ long, log }) {
    const rounds = long ? 20 : 4;
    const gens = Array.from({ length: fullFiles }, () => 0);
    const rig = await startRig("diskfull", chaosOsc(0, gens), async (node) => {
      await node.execOk(["sh", "-c", `mkdir -p ${fullDir} && mount -t tmpfs -o size=256k,mode=0755 chaos-full ${fullDir}`]);
    });
    try {
      const core = rig.cluster.admin().makeApiClient(CoreV1Api);
      const enospcEvents = async () => {
        const list = await core.listNamespacedEvent({ namespace: "default", fieldSelector: `involvedObject.name=${rig.agent.name},reason=OSCApplyFailed` });
        return list.items.filter((e) => e.message?.includes("ENOSPC"));
      };
      const countOf = (es: Awaited<ReturnType<typeof enospcEvents>>) => es.reduce((n, e) => n + (e.count ?? 1), 0);
      const clock = faultClock(31);
      const result = { passed: 0, failures: [] as string[], warningMs: [] as number[], convergeMs: [] as number[], retries: 0 };
      for (let round = 0, version = 0; round < rounds; round++) {
        const prev = chaosOsc(version, gens);
        // Which of the directory's files change (at least one), and how many pages stay free (fewer than one file needs).
        const changed = clock.rand.subset([...gens.keys()], 0.5);
        if (changed.length === 0) changed.push(clock.rand.int(fullFiles));
        for (const j of changed) gens[j] = (gens[j] as number) + 1;
        const next = chaosOsc(++version, gens);
        const first = `${fullDir}/g${Math.min(...changed)}`;
        const room = clock.rand.int(3);
        try {
          await rig.node.execOk(["sh", "-c", `dd if=/dev/zero of=${filler} bs=${page} 2>/dev/null; truncate -s -${room * page} ${filler}`]);
          const before = await lookAtNode(rig.node);
          const fillerSha = before.files.get(filler)?.sha256;
          const [events, logged, incomplete] = [countOf(await enospcEvents()), (await agentLogLines(rig.node, '"step failed"')).length, (await agentLogLines(rig.node, '"OSC apply incomplete"')).length];
          const changes = rig.annotation.changes.length;
          const put = performance.now();
          await rig.put(next);
          const warning = await waitFor("a Warning event about the full disk", async () => {
            const es = await enospcEvents();
            return countOf(es) > events ? es.sort((a, b) => String(b.lastTimestamp).localeCompare(String(a.lastTimestamp)))[0] : undefined;
          }, 60_000, 100);
          result.warningMs.push(Math.round(performance.now() - put));
          if (round === 0) log(`Warning ${warning?.reason}: ${warning?.message}`);
          const problems: string[] = [];
          if (!warning?.message?.includes(first)) problems.push(`the Warning event does not name ${first}: ${warning?.message}`);
          const lines = (await agentLogLines(rig.node, '"step failed"')).slice(logged);
          if (!lines.some((l) => l.includes(first) && l.includes("ENOSPC"))) problems.push(`no "step failed" log line names ${first} and ENOSPC: ${lines.join(" | ") || "none"}`);
          // Nothing changed: the node is exactly at the previous version (its plan is kept to be retried).
          const mid = await lookAtNode(rig.node);
          problems.push(...differences(mid, prev, [filler]).filter((d) => !d.includes("unfinished plan")).map((d) => `while full: ${d}`));
          problems.push(...unexpectedStarts(before, mid, prev, prev, true).map((d) => `while full: ${d}`));
          if (mid.files.get(filler)?.sha256 !== fillerSha) problems.push("the file that filled the disk was changed");
          // Space freed: the retry converges.
          await rig.node.execOk(["rm", filler]);
          const freed = performance.now();
          await rig.annotation.until(next.checksum, 120_000);
          result.convergeMs.push(Math.round(performance.now() - freed));
          result.retries += (await agentLogLines(rig.node, '"OSC apply incomplete"')).length - incomplete;
          const after = await lookAtNode(rig.node);
          const seen = rig.annotation.changes.slice(changes);
          problems.push(...differences(after, next), ...unexpectedStarts(before, after, prev, next, true));
          if (seen.length !== 1) problems.push(`the Node's checksum annotation changed ${seen.length} times, want once`);
          if (problems.length === 0) result.passed++;
          else result.failures.push(`round ${round} (v${version}, ${first} first, ${room} page(s) free): ${problems.slice(0, 5).join("; ")}`);
        } catch (err) {
          result.failures.push(`round ${round} (v${version}): ${err instanceof Error ? err.message : String(err)}`);
          await rig.node.exec(["rm", "-f", filler]);
        }
        log(`${round + 1}/${rounds} rounds, ${result.passed} passed`);
      }
      const [warning, converge] = [spread(result.warningMs), spread(result.convergeMs)];
      return {
        checked:
          "while full: a Warning event and an error log line name the file and ENOSPC, the node is exactly at its previous state (no file, temp file or unit changed, the filler untouched); after freeing: every file's bytes, mode and owner, no other file, no temp file, each unit owed a restart started exactly once, the Node's checksum annotation changed exactly once",
        iterations: rounds,
        passed: result.passed,
        failures: result.failures,
        figures: { warningMsMedian: warning.median, failedAttempts: result.retries, convergeMsAfterFreeingMedian: converge.median, convergeMsAfterFreeingMax: converge.max },
      };
    } finally {
      await rig.stop();
    }
  },
};
