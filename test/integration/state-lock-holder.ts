// The other process of state-lock.test.ts: takes the state lock as `trellis run` would, leaves a temp
// file named as its own writes name theirs in DIR, says "locked", and holds both until it is killed.
//   bun state-lock-holder.ts LOCKFILE DIR
import { writeFileSync } from "node:fs";
import { tempName } from "../../src/host/files.ts";
import { lockStateDir } from "../../src/host/state-lock.ts";

const [lockPath, dir] = process.argv.slice(2);
if (!lockPath || !dir) throw new Error("usage: state-lock-holder.ts LOCKFILE DIR");
await lockStateDir(lockPath, "run");
const temp = `${dir}/${tempName("state.json")}`;
writeFileSync(temp, "half of a state file");
console.log(JSON.stringify({ locked: lockPath, temp }));
setInterval(() => {}, 1 << 30);
