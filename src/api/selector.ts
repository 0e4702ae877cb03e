// Kubernetes label selectors in their text form, as kubectl -l takes them: requirements separated by
// commas, each `key`, `!key`, `key=value` (or `==`), `key!=value`, `key in (a,b)`, `key notin (a,b)`. All
// must hold. Pure; used to aim a rollout at nodes (canary) and overlays at node groups.
import type { Result } from "./result.ts";

type Requirement =
  | { key: string; op: "exists" | "absent" }
  | { key: string; op: "in" | "notin"; values: ReadonlySet<string> };

export type Selector = { text: string; requirements: readonly Requirement[] };

// A label key: an optional DNS-subdomain prefix and a name of at most 63 characters.
const key = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
const value = /^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$/;

/** Splits at commas outside parentheses. */
function clauses(text: string): string[] | undefined {
  const out: string[] = [];
  let depth = 0;
  let cur = "";
  for (const ch of text) {
    if (ch === "(") depth++;
    if (ch === ")") depth--;
    if (depth < 0 || depth > 1) return undefined;
    if (ch === "," && depth === 0) {
      out.push(cur.trim());
      cur = "";
    } else cur += ch;
  }
  if (depth !== 0) return undefined;
  out.push(cur.trim());
  return out;
}

export function parseSelector(text: string): Result<Selector> {
  const parts = clauses(text);
  if (!parts) return { ok: false, errors: [`"${text}": unbalanced parentheses`] };
  const requirements: Requirement[] = [];
  const errors: string[] = [];
  for (const part of parts) {
    const bad = (why: string) => errors.push(`"${part}": ${why}`);
    let m: RegExpExecArray | null;
    if ((m = /^(\S+)\s+(in|notin)\s*\(([^)]*)\)$/.exec(part))) {
      const values = (m[3] as string).split(",").map((v) => v.trim());
      if (!key.test(m[1] as string)) bad("not a label key");
      else if (values.some((v) => !value.test(v))) bad("not a list of label values");
      else requirements.push({ key: m[1] as string, op: m[2] as "in" | "notin", values: new Set(values) });
    } else if ((m = /^([^!=\s]+)\s*(==|=|!=)\s*([^=\s]*)$/.exec(part))) {
      if (!key.test(m[1] as string)) bad("not a label key");
      else if (!value.test(m[3] as string)) bad("not a label value");
      else requirements.push({ key: m[1] as string, op: m[2] === "!=" ? "notin" : "in", values: new Set([m[3] as string]) });
    } else if ((m = /^(!?)\s*(\S+)$/.exec(part)) && key.test(m[2] as string)) {
      requirements.push({ key: m[2] as string, op: m[1] ? "absent" : "exists" });
    } else {
      bad(part === "" ? "empty requirement" : "not a requirement (key, !key, key=value, key!=value, key in (…), key notin (…))");
    }
  }
  return errors.length > 0 ? { ok: false, errors } : { ok: true, value: { text, requirements } };
}

/** Whether labels satisfy every requirement (notin and != also hold where the label is missing, as in Kubernetes). */
export function matches(selector: Selector, labels: Readonly<Record<string, string>>): boolean {
  return selector.requirements.every((r) => {
    const v = labels[r.key];
    switch (r.op) {
      case "exists":
        return v !== undefined;
      case "absent":
        return v === undefined;
      case "in":
        return v !== undefined && r.values.has(v);
      case "notin":
        return v === undefined || !r.values.has(v);
    }
  });
}
