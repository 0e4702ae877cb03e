// Ordering of names (units, paths, files) by their UTF-16 code units. Not localeCompare: that loads ICU's
// collator, whose tables add about 2 MiB of the executable's pages to the agent's resident memory
// (measured with a compiled Bun 1.4.5 binary), for an order nobody reads as prose.
export const compareText = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);
