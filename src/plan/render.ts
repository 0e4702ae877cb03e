// `trellis plan` output for a person: one line per step, what and why, in execution order.
import type { Plan, Step, Target } from "../api/plan.ts";

export function renderPlan(plan: Plan): string {
  if (plan.steps.length === 0) return `OSC ${short(plan.checksum)}: the node is up to date, nothing to do.`;
  const lines = plan.steps.map((s, i) => `${String(i + 1).padStart(3)}. ${describeStep(s)}`);
  return [`OSC ${short(plan.checksum)}: ${summary(plan.steps)}`, ...lines].join("\n");
}

export function describeStep(s: Step): string {
  switch (s.kind) {
    case "write":
      return `write ${targetName(s.target)} ${s.path} (mode 0${s.mode.toString(8)}): ${s.reason}`;
    case "remove":
      return `remove ${targetName(s.target)} ${s.path}: ${s.reason}`;
    case "daemon-reload":
      return `daemon-reload: ${s.reason}`;
    default:
      return `${s.kind} ${s.unit}: ${s.reason}`;
  }
}

function targetName(t: Target): string {
  if (t.type === "file") return "file";
  if (t.type === "unit") return "unit file";
  return t.type === "drop-in" ? `drop-in of ${t.unit}` : `every drop-in of ${t.unit}, directory and all,`;
}

function summary(steps: Step[]): string {
  const count = (pred: (s: Step) => boolean) => steps.filter(pred).length;
  const parts = [
    [count((s) => s.kind === "write" && s.target.type === "file"), "file(s) to write"],
    [count((s) => s.kind === "remove" && s.target.type === "file"), "file(s) to remove"],
    [count((s) => (s.kind === "write" || s.kind === "remove") && s.target.type !== "file"), "unit file/drop-in change(s)"],
    [count((s) => s.kind === "restart"), "unit(s) to restart"],
    [count((s) => s.kind === "stop"), "unit(s) to stop"],
  ] as const;
  return parts.filter(([n]) => n > 0).map(([n, what]) => `${n} ${what}`).join(", ");
}

const short = (checksum: string) => checksum.slice(0, 12);
