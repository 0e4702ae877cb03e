// A seeded PRNG (mulberry32) for property tests and benchmark data: a seed reproduces exactly.
export function prng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    chance: (p: number) => next() < p,
    pick: <T>(xs: readonly T[]): T => xs[Math.floor(next() * xs.length)] as T,
    int: (n: number) => Math.floor(next() * n),
    subset: <T>(xs: readonly T[], p = 0.5): T[] => xs.filter(() => next() < p),
  };
}
