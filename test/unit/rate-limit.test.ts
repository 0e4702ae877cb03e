import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { coreV1 } from "../../src/kube/api.ts";
import { type Kube, kubeFromConnection } from "../../src/kube/client.ts";
import { kubeGet } from "../../src/kube/http.ts";
import { throttle, tokenBucket } from "../../src/kube/rate-limit.ts";

describe("the token bucket (client-go's client-side rate limit)", () => {
  const clock = () => {
    let t = 1_000;
    return { now: () => t, advance: (ms: number) => void (t += ms) };
  };

  test("burst requests pass at once, then one per 1/qps second; each waits its turn", () => {
    const c = clock();
    const b = tokenBucket({ qps: 10, burst: 3 }, c.now);
    expect([b.take(), b.take(), b.take()]).toEqual([0, 0, 0]);
    expect(b.take()).toBeCloseTo(100);
    expect(b.take()).toBeCloseTo(200);
    c.advance(200);
    // The two waiting took the tokens of those 200 ms.
    expect(b.take()).toBeCloseTo(100);
  });

  test("an idle bucket fills up to burst, no further", () => {
    const c = clock();
    const b = tokenBucket({ qps: 2, burst: 2 }, c.now);
    b.take();
    b.take();
    c.advance(60_000);
    expect([b.take(), b.take()]).toEqual([0, 0]);
    expect(b.take()).toBeCloseTo(500);
  });

  test("a token given back (the request abandoned while it waited) is the next caller's", () => {
    const c = clock();
    const b = tokenBucket({ qps: 1, burst: 1 }, c.now);
    b.take();
    expect(b.take()).toBeCloseTo(1000);
    b.giveBack();
    expect(b.take()).toBeCloseTo(1000);
  });

  test.each([[-1], [Number.POSITIVE_INFINITY]])("qps %p: no limit", (qps) => expect(throttle({ qps, burst: 100 })).toBeUndefined());

  test("a wait ends when the request's signal aborts, with its reason", async () => {
    const t = throttle({ qps: 0.001, burst: 1 }) as NonNullable<ReturnType<typeof throttle>>;
    const stop = new AbortController();
    await t(stop.signal);
    const waiting = t(stop.signal).then(() => "sent", (e: unknown) => e);
    stop.abort(new Error("stopping"));
    expect(await waiting).toEqual(new Error("stopping"));
  });
});

describe("every request of a Kube made with a limit waits for it: api.ts's and kubeGet's (watches, lists)", () => {
  const arrivals: number[] = [];
  let server: ReturnType<typeof Bun.serve>;
  let dir: string;
  let kube: Kube;
  beforeAll(() => {
    server = Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      fetch: () => {
        arrivals.push(performance.now());
        return Response.json({ kind: "Node", apiVersion: "v1", metadata: { name: "n" } });
      },
    });
    dir = mkdtempSync("/tmp/trellis-rate-limit-");
    writeFileSync(
      `${dir}/kubeconfig`,
      `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:${server.port}", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`,
    );
    kube = kubeFromConnection({ kind: "kubeconfig", path: `${dir}/kubeconfig` }, { qps: 20, burst: 2 });
  });
  afterAll(() => {
    server.stop(true);
    rmSync(dir, { recursive: true, force: true });
  });

  test("6 requests at once: 2 at once (burst), the last 4 at 20/s, so not before 200 ms after the first", async () => {
    const core = coreV1(kube);
    const signal = AbortSignal.timeout(10_000);
    await Promise.all([
      ...[1, 2, 3].map(() => core.readNode({ name: "n" })),
      ...[1, 2, 3].map(() => kubeGet(kube, "/api/v1/nodes/n", {}, signal).then((r) => r.text())),
    ]);
    expect(arrivals).toHaveLength(6);
    // A lower bound only: the bucket cannot let them through sooner; a loaded machine may be later.
    expect(Math.max(...arrivals) - Math.min(...arrivals)).toBeGreaterThanOrEqual(190);
  });
});
