/** What parsing and checking input gives: the value, or every problem found, each naming its object and field. */
export type Result<T> = { ok: true; value: T } | { ok: false; errors: string[] };
