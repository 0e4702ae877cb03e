const errno = (err: unknown) => (err as { code?: unknown } | null)?.code;

/** Is `pid` a live process in this PID namespace? (EPERM: alive, someone else's.) */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return errno(err) === "EPERM";
  }
}
