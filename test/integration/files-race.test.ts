// Time of check against time of use in src/host/files.ts, with a real attacker: a process running as
// another user (uid 4242, no groups) swaps entries of a sticky world-writable directory (a /tmp) as fast
// as it can while trellis writes there as root. What the walk refuses outright (entries owned by other
// users, entries of directories they may rename in) leaves two windows a check-then-use by path would
// open, and each is raced here:
// - a directory trellis must create is missing at the check, and the attacker plants a symlink to a
//   root-owned directory under its name: nothing may ever land there;
// - the file's own name is missing at the check, and the attacker plants a symlink, a FIFO or a directory
//   there: the rename replaces the first two (never opening them), the third makes the write fail.
// On the host's disk, with createFiles("/") as on a node; the tree lives in this run's directory.
import { afterEach, describe, expect, test } from "bun:test";
import { chmodSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import type { Subprocess } from "bun";
import { createFiles, FileError } from "../../src/host/files.ts";
import { runDir } from "../harness/exec.ts";

const base = runDir("files-race");
const attacker = 4242;
const rounds = 300;

// Swaps `link` between the kinds given (symlink to `target`, fifo, dir) and nothing, in a tight loop.
const racerScript = `
use POSIX qw(mkfifo);
my ($link, $target, @kinds) = @ARGV;
$| = 1;
my $first = 1;
while (1) {
  for my $kind (@kinds) {
    if ($kind eq "symlink") { symlink($target, $link) } elsif ($kind eq "fifo") { mkfifo($link, 0666) } else { mkdir($link) }
    if ($first) { print "racing\\n"; $first = 0 }
    unlink($link) or rmdir($link);
  }
}`;

let racers: Subprocess<"ignore", "pipe", "pipe">[] = [];
afterEach(async () => {
  for (const r of racers) {
    r.kill("SIGKILL");
    await r.exited;
  }
  racers = [];
});

/** Starts the attacker as uid 4242 and resolves once it swaps. */
async function race(link: string, target: string, kinds: ("symlink" | "fifo" | "dir")[]): Promise<void> {
  const p = Bun.spawn(["setpriv", `--reuid=${attacker}`, `--regid=${attacker}`, "--clear-groups", "perl", "-e", racerScript, link, target, ...kinds], {
    stdin: "ignore",
    stdout: "pipe",
    stderr: "pipe",
  });
  racers.push(p);
  const reader = p.stdout.getReader();
  const { value } = await reader.read();
  reader.releaseLock();
  if (!value || !new TextDecoder().decode(value).startsWith("racing")) throw new Error(`the attacker did not start (exit ${await p.exited}): ${await new Response(p.stderr).text()}`);
}

/** A tree for one test: a sticky world-writable `tmp` and a root-owned `etc` the attacker would like to write to. */
function tree(): { tmp: string; etc: string } {
  const dir = mkdtempSync(`${base}/tree-`);
  chmodSync(dir, 0o755); // the attacker must reach tmp
  mkdirSync(`${dir}/tmp`);
  chmodSync(`${dir}/tmp`, 0o1777);
  mkdirSync(`${dir}/etc`);
  return { tmp: `${dir}/tmp`, etc: `${dir}/etc` };
}

type Tally = Record<string, number>;
const count = (t: Tally, key: string) => (t[key] = (t[key] ?? 0) + 1);

describe("a swap between check and write does not redirect the write", () => {
  const files = createFiles("/");

  test(`a missing directory planted as a symlink to a root-owned one: ${rounds} writes, none lands there`, async () => {
    const { tmp, etc } = tree();
    await race(`${tmp}/new`, etc, ["symlink"]);
    const tally: Tally = {};
    for (let i = 0; i < rounds; i++) {
      try {
        await files.writeAtomic(`${tmp}/new/config`, `round ${i}\n`, 0o644);
        if (existsSync(`${etc}/config`)) count(tally, "LANDED in etc");
        else {
          // It went into a directory trellis made (root's: the attacker can neither replace nor enter-and-swap it).
          const made = lstatSync(`${tmp}/new`);
          expect(made.isDirectory() && made.uid === 0).toBe(true);
          expect(readFileSync(`${tmp}/new/config`, "utf8")).toBe(`round ${i}\n`);
          count(tally, "written into a directory trellis made");
          rmSync(`${tmp}/new`, { recursive: true });
        }
      } catch (err) {
        if (!(err instanceof FileError)) throw err;
        count(tally, err.reason.includes("unsafe path transition") ? "refused: unsafe path transition" : `refused: ${err.reason.replace(/\d+/g, "N")}`);
      }
      for (const name of readdirSync(etc)) {
        if (name !== "config") count(tally, "LANDED in etc"); // a temp file left behind there
        rmSync(`${etc}/${name}`);
      }
    }
    console.log(`[files-race] planted parent symlink, ${rounds} writes:`, JSON.stringify(tally));
    expect(tally["LANDED in etc"]).toBeUndefined();
    expect(tally["refused: unsafe path transition"] ?? 0).toBeGreaterThan(0); // the attacker really was there
  }, 60_000);

  test(`the file's own name planted as a symlink, FIFO or directory: ${rounds} writes, none through it, none blocking`, async () => {
    const { tmp, etc } = tree();
    await race(`${tmp}/file`, `${etc}/passwd`, ["symlink", "fifo", "dir"]);
    const tally: Tally = {};
    for (let i = 0; i < rounds; i++) {
      try {
        await files.writeAtomic(`${tmp}/file`, `round ${i}\n`, 0o600);
        const st = lstatSync(`${tmp}/file`);
        expect(st.isFile() && st.uid === 0).toBe(true);
        count(tally, "written: the rename replaced whatever was there");
        rmSync(`${tmp}/file`);
      } catch (err) {
        if (!(err instanceof FileError)) throw err;
        count(tally, `refused: ${err.reason.replace(/\.file\.trellis-tmp-\S+/, "<temp>").replace(/\d+/g, "N")}`);
      }
      expect(existsSync(`${etc}/passwd`)).toBe(false);
    }
    console.log(`[files-race] planted final name, ${rounds} writes:`, JSON.stringify(tally));
    expect(readdirSync(etc)).toEqual([]);
    expect(readdirSync(tmp).filter((n) => n.includes(".trellis-tmp-"))).toEqual([]);
  }, 60_000);
});
