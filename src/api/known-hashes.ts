// The sha256 of the node's files by identity (Files.inspect), kept between runs so a restarted agent's first
// reconcile reads only the files that changed while it was down. Parsed like any state read from disk.
import * as v from "valibot";
import { object, record } from "./shapes.ts";

export const KnownHashesSchema = object({
  version: v.literal(1),
  files: record(v.string(), object({ identity: v.string(), sha256: v.pipe(v.string(), v.regex(/^[0-9a-f]{64}$/)) })),
});
export type KnownHashesFile = v.InferOutput<typeof KnownHashesSchema>;
