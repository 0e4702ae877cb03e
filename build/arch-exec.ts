// How to run a trellis binary built for either architecture on this machine: natively, or through
// Debian's qemu-user-static with that architecture's C library (libc6-<arch>-cross) as the loader's
// root, since a Bun executable links glibc dynamically. build/setup.sh installs both for arm64.
export type Arch = "amd64" | "arm64";

export const hostArch: Arch = process.arch === "arm64" ? "arm64" : "amd64";

const emulators: Record<Arch, { qemu: string; sysroot: string; packages: string }> = {
  amd64: { qemu: "qemu-x86_64-static", sysroot: "/usr/x86_64-linux-gnu", packages: "qemu-user-static libc6-amd64-cross" },
  arm64: { qemu: "qemu-aarch64-static", sysroot: "/usr/aarch64-linux-gnu", packages: "qemu-user-static libc6-arm64-cross" },
};

/** The command line that runs `binary` (built for `arch`) here; prefix it to the binary's arguments. */
export function commandFor(arch: Arch, binary: string): string[] {
  if (arch === hostArch) return [binary];
  const e = emulators[arch];
  return [e.qemu, "-L", e.sysroot, binary];
}

/** What to install when the emulator for `arch` is missing (for error messages). */
export const emulatorPackages = (arch: Arch) => emulators[arch].packages;
