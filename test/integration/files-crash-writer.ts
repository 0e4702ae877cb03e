// The victim of files-crash.test.ts: rewrites files through src/host/files.ts until it is SIGKILLed.
//   bun files-crash-writer.ts init|write|cleanup ROOT DIR
// init writes every file once (content 0); write loops, alternating each file between its two contents,
// after printing "writing"; cleanup runs cleanupTemp on DIR and prints the removed names as JSON.
import { createFiles } from "../../src/host/files.ts";

export type Victim = { name: string; mode: number; contents: [Uint8Array, Uint8Array] };

const small = (name: string, mode: number): Victim => ({
  name,
  mode,
  contents: [new TextEncoder().encode(`${name}: first\n`), new TextEncoder().encode(`${name}: second, longer\n`)],
});

// Modes the writer's umask (0077) would not give by itself: they must come from the fchmod. "big" is
// 4 MiB because a kill interrupts a write() that large halfway: an in-place writer (open O_TRUNC, write)
// was caught tearing it in each of 9 runs of 60 kills, but never at 256 KiB or 1 MiB.
export const victims: Victim[] = [
  { name: "big", mode: 0o644, contents: [new Uint8Array(4 << 20).fill(0x41), new Uint8Array(4 << 20).fill(0x42)] },
  small("small-a", 0o640),
  small("small-b", 0o755),
  small("small-c", 0o600),
];

async function main(command: string | undefined, root: string | undefined, dir: string | undefined): Promise<void> {
  if (!root || !dir) throw new Error("usage: files-crash-writer.ts init|write|cleanup ROOT DIR");
  const files = createFiles(root);
  process.umask(0o077);
  if (command === "cleanup") {
    console.log(JSON.stringify(await files.cleanupTemp(dir)));
    return;
  }
  if (command === "init") {
    for (const v of victims) await files.writeAtomic(`${dir}/${v.name}`, v.contents[0], v.mode);
    return;
  }
  if (command !== "write") throw new Error(`unknown command ${command}`);
  process.stdout.write("writing\n");
  for (let i = 1; ; i++) {
    for (const v of victims) await files.writeAtomic(`${dir}/${v.name}`, v.contents[i % 2] as Uint8Array, v.mode);
  }
}

if (import.meta.main) await main(process.argv[2], process.argv[3], process.argv[4]);
