// decodeBase64 accepts exactly what the padded, line-break-tolerant grammar of Go's StdEncoding accepts
// (the regex it used before, kept here as the reference), and decodes to what Buffer does.
import { expect, test } from "bun:test";
import { Buffer } from "node:buffer";
import { decodeBase64 } from "../../src/api/base64.ts";

const reference = (text: string): Uint8Array | undefined => {
  const compact = text.replace(/[\r\n]/g, "");
  return /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/.test(compact) ? new Uint8Array(Buffer.from(compact, "base64")) : undefined;
};

test("edge cases agree with the grammar", () => {
  for (const text of ["", "=", "==", "===", "====", "A===", "AB==", "ABC=", "ABCD", "ABCD====", "AB=C", "A=BC", "ABCDAB==", "AB==ABCD", "QQ==\n", "QU\nJD", "\r\nQUJD\r\n", "QUJD-", "QUJD QUJD", "QUJD\tQUJD", "QUJ€", "QQ=", "QQ", "Q"]) {
    expect([text, decodeBase64(text)]).toEqual([text, reference(text)]);
  }
});

test("seeded random texts over a small alphabet agree with the grammar (20 000 cases)", () => {
  let seed = 20261126;
  const random = () => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed / 2 ** 31;
  };
  const chars = "AQgw+/9=\n\r -_.";
  let accepted = 0;
  for (let i = 0; i < 20_000; i++) {
    // Mostly valid base64 with a mutation or two, so that both outcomes are common.
    const valid = Buffer.from(Array.from({ length: Math.floor(random() * 12) }, () => Math.floor(random() * 256))).toString("base64");
    const chars2 = [...valid];
    for (let m = Math.floor(random() * 3); m > 0; m--) chars2.splice(Math.floor(random() * (chars2.length + 1)), random() < 0.5 ? 1 : 0, chars[Math.floor(random() * chars.length)] as string);
    const text = chars2.join("");
    const got = decodeBase64(text);
    expect([text, got]).toEqual([text, reference(text)]);
    if (got) accepted++;
  }
  expect(accepted).toBeGreaterThan(4_000);
  expect(accepted).toBeLessThan(16_000);
});

test("a 1 MiB value decodes, and one bad character deep inside it is refused", () => {
  const bytes = new Uint8Array(1 << 20).map((_, i) => (i * 7919) & 0xff);
  const text = Buffer.from(bytes).toString("base64");
  expect(decodeBase64(text)).toEqual(bytes);
  expect(decodeBase64(`${text.slice(0, -4)}!${text.slice(-3)}`)).toBeUndefined();
});
