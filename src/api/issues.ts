import type * as v from "valibot";

/** "controllers.operatingSystemConfig.secretName: Invalid type: …" — one line per problem, naming the field. */
export function formatIssues(issues: readonly v.BaseIssue<unknown>[]): string[] {
  return issues.map((issue) => {
    const path = (issue.path ?? []).map((p) => String(p.key)).join(".");
    return path === "" ? issue.message : `${path}: ${issue.message}`;
  });
}
