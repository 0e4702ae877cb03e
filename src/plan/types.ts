/** What is on the node now, as far as the plan needs to know. */
export type Observed = {
  /** Every path the plan may touch: sha256 and mode, or null when missing. */
  files: ReadonlyMap<string, { sha256: string; mode: number } | null>;
  /** Paths reached through a symlink: the path each lands on (Files.landsAt), where it differs. */
  landsAt?: ReadonlyMap<string, string>;
  /** Desired units without drop-ins whose drop-in directory (<unit>.d) exists; absent: none does. */
  dropInDirs?: ReadonlySet<string>;
  /** systemd's view of the units involved; undefined when systemd is not consulted (`plan --root`). */
  units?: ReadonlyMap<string, { unitFileState: string; activeState: string }>;
};
