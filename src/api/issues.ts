import type * as v from "valibot";

/** A field below `parent`, named as errors and reports name it: "spec.files[3].permissions". */
export const fieldPath = (parent: string, key: string | number): string => (typeof key === "number" ? `${parent}[${key}]` : parent === "" ? key : `${parent}.${key}`);

/**
 * "controllers.operatingSystemConfig.secretName: Invalid type: …", "spec.files[3].permissions: …" — one
 * line per problem, naming the field the way the semantic checks (desired.ts) name it.
 */
export function formatIssues(issues: readonly v.BaseIssue<unknown>[]): string[] {
  return issues.map((issue) => {
    const path = (issue.path ?? []).reduce((at, p) => fieldPath(at, p.type === "array" ? (p.key as number) : String(p.key)), "");
    return path === "" ? issue.message : `${path}: ${issue.message}`;
  });
}
