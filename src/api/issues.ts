import type * as v from "valibot";

/**
 * "controllers.operatingSystemConfig.secretName: Invalid type: …", "spec.files[3].permissions: …" — one
 * line per problem, naming the field the way the semantic checks (desired.ts) name it.
 */
export function formatIssues(issues: readonly v.BaseIssue<unknown>[]): string[] {
  return issues.map((issue) => {
    const path = (issue.path ?? []).map((p) => (p.type === "array" ? `[${String(p.key)}]` : `.${String(p.key)}`)).join("").replace(/^\./, "");
    return path === "" ? issue.message : `${path}: ${issue.message}`;
  });
}
