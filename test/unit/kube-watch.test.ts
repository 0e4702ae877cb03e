// The pure parts of src/kube/watch.ts: backoff delays, what a relist delivers, and reading a watch
// stream's lines (including the in-stream ERROR 410 that the e2e tests cannot make a real apiserver send).
import { describe, expect, test } from "bun:test";
import { KubeError } from "../../src/kube/errors.ts";
import { statusError } from "../../src/kube/http.ts";
import { decodeWatchLine, type KubeObject, LineSplitter, nextRetry, outageReason, relistEvents } from "../../src/kube/watch.ts";
import { backoffDelay } from "../../src/time.ts";

describe("backoffDelay", () => {
  const b = { initialMs: 500, maxMs: 30_000 };
  test("doubles from the initial delay up to the cap", () => {
    expect([1, 2, 3, 4, 5, 6, 7, 8, 20].map((n) => backoffDelay(n, b, 1))).toEqual([500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
  });
  test("jitter keeps each delay between half and all of its ceiling", () => {
    expect(backoffDelay(3, b, 0)).toBe(1000);
    expect(backoffDelay(3, b, 0.5)).toBe(1500);
    expect(backoffDelay(100, b, 0)).toBe(15_000);
  });
});

// Found by test/chaos/scenarios/apiserver-down.ts: after a 15 s outage the agent's watches reconnected up
// to 9.8 s after the API server was back, and answered what the restarted server said first (403 before
// its RBAC cache was filled, then 410) with 15–25 s waits, so a Secret changed during the outage was
// applied 16–28 s late.
describe("outageReason", () => {
  test("an API server answering 429/500/502/503/504 (no etcd, its watch cache initializing) is an outage like one that cannot be reached; other answers are what they are", () => {
    for (const status of [429, 500, 502, 503, 504]) expect(outageReason(new KubeError("x", "http", status))).toBe("unreachable");
    expect(outageReason(new KubeError("x", "unreachable"))).toBe("unreachable");
    expect(outageReason(new KubeError("x", "http", 400))).toBe("http");
    expect(outageReason(new KubeError("x", "forbidden", 403))).toBe("forbidden");
    expect(outageReason(new KubeError("x", "gone", 410))).toBe("gone");
  });
});

describe("nextRetry", () => {
  const b = { initialMs: 500, maxMs: 30_000, unreachableMaxMs: 4_000, resetAfterMs: 60_000 };
  test("an unreachable server is tried again at least every unreachableMaxMs, however long the outage", () => {
    expect(nextRetry({ failures: 20, reason: "unreachable" }, { reason: "unreachable" }, b, 1)).toEqual({ failures: 21, delayMs: 4_000 });
  });
  test("a server that answers with an error backs off up to maxMs", () => {
    expect(nextRetry({ failures: 20, reason: "http" }, { reason: "http" }, b, 1)).toEqual({ failures: 21, delayMs: 30_000 });
  });
  test("the first answer after an outage (a 403 of a restarting API server) starts the doubling over", () => {
    expect(nextRetry({ failures: 9, reason: "unreachable" }, { reason: "forbidden" }, b, 1)).toEqual({ failures: 1, delayMs: 500 });
    expect(nextRetry({ failures: 1, reason: "forbidden" }, { reason: "forbidden" }, b, 1)).toEqual({ failures: 2, delayMs: 1_000 });
  });
  test("a 410 after an outage relists after the initial delay, not the outage's backoff", () => {
    expect(nextRetry({ failures: 9, reason: "http" }, { reason: "gone" }, b, 1)).toEqual({ failures: 1, delayMs: 500 });
  });
  test("a server that names an earlier retry than the backoff's ceiling (a 429 with retryAfterSeconds 1) is tried then, spread by up to a fifth", () => {
    expect(nextRetry({ failures: 20, reason: "unreachable" }, { reason: "unreachable", retryAfterMs: 1_000 }, b, 0)).toEqual({ failures: 21, delayMs: 1_000 });
    expect(nextRetry({ failures: 20, reason: "unreachable" }, { reason: "unreachable", retryAfterMs: 1_000 }, b, 1)).toEqual({ failures: 21, delayMs: 1_200 });
    expect(nextRetry({ failures: 20, reason: "unreachable" }, { reason: "unreachable", retryAfterMs: 3_000 }, b, 1)).toEqual({ failures: 21, delayMs: 3_600 });
  });
  test("a later retry than the ceiling (30 s after a long etcd outage) is not waited for", () => {
    expect(nextRetry({ failures: 20, reason: "unreachable" }, { reason: "unreachable", retryAfterMs: 30_000 }, b, 1)).toEqual({ failures: 21, delayMs: 4_000 });
    expect(nextRetry({ failures: 20, reason: "http" }, { reason: "http", retryAfterMs: 600_000 }, b, 1)).toEqual({ failures: 21, delayMs: 30_000 });
  });
});

describe("retryAfterMs of an API server's Status", () => {
  const status = (details: unknown) => statusError({ server: "https://s", caSource: "ca" }, "watching", 429, JSON.stringify({ kind: "Status", code: 429, message: "storage is (re)initializing", details }));
  test("details.retryAfterSeconds becomes the error's retryAfterMs", () => {
    expect(status({ retryAfterSeconds: 1 }).retryAfterMs).toBe(1_000);
  });
  test("none, zero, fractions, strings and absurd values are not believed", () => {
    for (const d of [undefined, {}, { retryAfterSeconds: 0 }, { retryAfterSeconds: 1.5 }, { retryAfterSeconds: "1" }, { retryAfterSeconds: 86_400 }]) expect(status(d).retryAfterMs).toBeUndefined();
  });
});

describe("relistEvents", () => {
  const obj = (name: string, uid: string, rv: string): KubeObject => ({ metadata: { name, namespace: "ns", uid, resourceVersion: rv } });
  const known = new Map([
    ["ns/same", obj("same", "u1", "10")],
    ["ns/changed", obj("changed", "u2", "11")],
    ["ns/gone", obj("gone", "u3", "12")],
    ["ns/replaced", obj("replaced", "u4", "13")],
  ]);
  test("the first list is all ADDED", () => {
    expect(relistEvents(new Map(), [obj("a", "u", "1")]).map((e) => e.type)).toEqual(["ADDED"]);
  });
  test("a relist repeats nothing: DELETED for vanished and replaced objects, then ADDED/MODIFIED in list order", () => {
    const events = relistEvents(known, [obj("new", "u5", "20"), obj("same", "u1", "10"), obj("changed", "u2", "21"), obj("replaced", "u6", "22")]);
    expect(events.map((e) => `${e.type} ${e.object.metadata?.name} ${e.object.metadata?.resourceVersion}`)).toEqual([
      "DELETED gone 12",
      "DELETED replaced 13",
      "ADDED new 20",
      "MODIFIED changed 21",
      "ADDED replaced 22",
    ]);
  });
});

describe("decodeWatchLine", () => {
  test("events and bookmarks carry their resourceVersion", () => {
    expect(decodeWatchLine('{"type":"MODIFIED","object":{"metadata":{"name":"a","resourceVersion":"7"}}}')).toEqual({
      type: "MODIFIED",
      object: { metadata: { name: "a", resourceVersion: "7" } },
      resourceVersion: "7",
    });
    expect(decodeWatchLine('{"type":"BOOKMARK","object":{"kind":"Secret","metadata":{"resourceVersion":"9"}}}')).toEqual({ type: "BOOKMARK", resourceVersion: "9" });
  });
  test("an in-stream ERROR 410 becomes a 'gone' KubeError, which makes the watcher list again", () => {
    const line = '{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version: 5 (9)","reason":"Expired","code":410}}';
    const decoded = decodeWatchLine(line);
    expect(decoded).toMatchObject({ type: "ERROR", code: 410 });
    if (decoded.type !== "ERROR") throw new Error("not an ERROR");
    const err = statusError({ server: "https://x", caSource: "ca.crt" }, "watching s", decoded.code, decoded.status);
    expect(err).toMatchObject({ reason: "gone", status: 410, message: "watching s: gone (410): too old resource version: 5 (9)" });
  });
  test("a line that is not a watch event is an error, not skipped", () => {
    expect(() => decodeWatchLine("{not json")).toThrow("unreadable event");
    expect(() => decodeWatchLine('{"type":"ADDED","object":{"metadata":{}}}')).toThrow("ADDED event without a resourceVersion");
    expect(() => decodeWatchLine('{"type":"SYNC","object":{"metadata":{"resourceVersion":"1"}}}')).toThrow('unknown event type "SYNC"');
  });
});

describe("LineSplitter", () => {
  const bytes = (s: string) => new TextEncoder().encode(s);
  const splitter = (max = 16) => new LineSplitter(max, (n) => new Error(`longer than ${n} bytes`));
  test("lines across chunks, several in one chunk, a character split between chunks", () => {
    const s = splitter();
    const euro = bytes("€"); // 3 bytes
    expect(s.push(bytes('{"a":'))).toEqual([]);
    expect(s.push(bytes('1}\n{"b":2}\n{"c":'))).toEqual(['{"a":1}', '{"b":2}']);
    expect(s.push(euro.subarray(0, 1))).toEqual([]);
    expect(s.push(new Uint8Array([...euro.subarray(1), 10]))).toEqual(['{"c":€']);
    expect(s.rest()).toBe("");
    expect(s.push(bytes("tail"))).toEqual([]);
    expect(s.rest()).toBe("tail");
  });
  test("a line of exactly the limit is fine; one byte more fails as soon as it arrives, before any newline", () => {
    expect(splitter().push(bytes(`${"x".repeat(16)}\n`))).toEqual(["x".repeat(16)]);
    const s = splitter();
    s.push(bytes("x".repeat(10)));
    expect(() => s.push(bytes("x".repeat(7)))).toThrow("longer than 16 bytes");
  });
  test("the limit is per line, not per chunk", () => {
    expect(splitter().push(bytes(`${"x".repeat(16)}\n${"y".repeat(16)}\n`))).toEqual(["x".repeat(16), "y".repeat(16)]);
  });
});
