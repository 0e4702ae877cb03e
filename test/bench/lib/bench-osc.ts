// The benchmarks' OSC: 500 files (1–4 KiB) and 50 units (`sleep infinity`, 10 files each in filePaths),
// deterministic so that every run and every agent works on the same bytes.
//
// Restarts are observed by the units themselves: ExecStart is
//   /bin/bash -c 'echo $EPOCHREALTIME >> /run/bench-uNN.started; exec sleep infinity'
// (bash's builtin clock: no extra process before the timestamp). The node shares the host's
// CLOCK_REALTIME (no time namespace), so that timestamp can be compared with the host's clock. The file
// is read from the host through /proc/PID/root, which spawns nothing; appending also counts every start
// of every unit, so a benchmark can check that exactly the changed unit restarted.
import { Buffer } from "node:buffer";
import type { V1Secret } from "@kubernetes/client-node";
import { sha256Hex } from "../../../src/api/desired.ts";
import type { Node } from "../../harness/node.ts";
import { prng } from "../../harness/prng.ts";

export const FILES_PER_UNIT = 10;
export const UNITS = 50;

export const unitName = (u: number) => `bench-u${String(u).padStart(2, "0")}.service`;
export const startedFile = (u: number) => `/run/bench-u${String(u).padStart(2, "0")}.started`;
const filePath = (u: number, f: number) => `/etc/bench/u${String(u).padStart(2, "0")}/f${f}.conf`;

// 1–4 KiB, skewed towards small (size = 1 KiB + 3 KiB·r³, mean ≈ 1.75 KiB): the whole OSC has to fit
// into one Secret, and the API server refuses Secrets over 1 MiB.
export const baseContents: string[] = (() => {
  const rnd = prng(42);
  const words = ["listen", "timeout", "buffer", "retry", "path", "level", "enable", "limit", "socket", "cache", "region", "threads"];
  const out: string[] = [];
  for (let i = 0; i < UNITS * FILES_PER_UNIT; i++) {
    const size = 1024 + Math.floor(3072 * rnd.next() ** 3);
    let text = `# bench file ${i}\n`;
    while (text.length < size) {
      text += `${rnd.pick(words)}_${rnd.int(1e6).toString(36)} = ${rnd.int(2 ** 40).toString(16)}\n`;
    }
    out.push(text.slice(0, size - 1) + "\n");
  }
  return out;
})();

export type OscShape = { units: number; filesPerUnit: number };

/** The OSC YAML after `change` changes: change n rewrites the first line of the first file of unit
 *  (n-1) % units, and later versions keep it, so that consecutive versions differ in exactly one file.
 *  A smaller `shape` takes the first units and files of the full one. */
export function oscYaml(change = 0, shape: OscShape = { units: UNITS, filesPerUnit: FILES_PER_UNIT }): string {
  const q = (s: string) => JSON.stringify(s); // a JSON string is a YAML double-quoted scalar
  const lines = [
    "apiVersion: extensions.gardener.cloud/v1alpha1",
    "kind: OperatingSystemConfig",
    "metadata:",
    "  name: bench",
    "  namespace: kube-system",
    "spec:",
    "  type: debian",
    "  purpose: reconcile",
    "  units:",
  ];
  for (let u = 0; u < shape.units; u++) {
    const content = [
      "[Unit]",
      `Description=trellis benchmark unit ${u}`,
      "[Service]",
      // $$ is systemd's escape for $: bash expands EPOCHREALTIME itself.
      `ExecStart=/bin/bash -c 'echo $$EPOCHREALTIME >> ${startedFile(u)}; exec sleep infinity'`,
      "[Install]",
      "WantedBy=multi-user.target",
      "",
    ].join("\n");
    lines.push(`  - name: ${unitName(u)}`, "    command: start", "    enable: true", `    content: ${q(content)}`, "    filePaths:");
    for (let f = 0; f < shape.filesPerUnit; f++) lines.push(`    - ${filePath(u, f)}`);
  }
  lines.push("  files:");
  const lastChange = new Map<number, number>(); // file index → the last change that rewrote it
  for (let n = 1; n <= change; n++) lastChange.set(((n - 1) % shape.units) * FILES_PER_UNIT, n);
  for (let u = 0; u < shape.units; u++) {
    for (let f = 0; f < shape.filesPerUnit; f++) {
      const i = u * FILES_PER_UNIT + f;
      let data = baseContents[i] as string;
      const n = lastChange.get(i);
      if (n !== undefined) data = `# bench file ${i}, change ${n}\n${data.slice(data.indexOf("\n") + 1)}`;
      lines.push(`  - path: ${filePath(u, f)}`, "    permissions: 0644", "    content:", "      inline:", '        encoding: ""', `        data: ${q(data)}`);
    }
  }
  return `${lines.join("\n")}\n`;
}

/** The OSC Secret as Gardener writes it. */
export function secretBody(name: string, text: string): V1Secret {
  return {
    metadata: {
      name,
      namespace: "kube-system",
      labels: { "gardener.cloud/role": "operating-system-config" },
      annotations: { "checksum/data-script": sha256Hex(text) },
    },
    data: { "osc.yaml": Buffer.from(text).toString("base64") },
  };
}

/** Start times (ms, CLOCK_REALTIME) of unit `u`: one line per start. */
export async function starts(node: Node, u: number): Promise<number[]> {
  const text = await node.readFile(startedFile(u)).catch(() => "");
  return text
    .split("\n")
    .filter(Boolean)
    .map((l) => Number(l) * 1000);
}

/** How often each unit should have started after `changes` changes (once, plus once per change to it). */
export const expectedStarts = (u: number, changes: number) => 1 + Array.from({ length: changes }, (_, i) => i % UNITS).filter((x) => x === u).length;
