// The image store (src/host/registry/) end to end against a real registry (Debian's docker-registry,
// distribution 2.8) with images pushed by skopeo, on the host: hostsDir and cacheDir are temp dirs. A
// small proxy of our own sits in front of the registry where a test needs to count requests, demand a
// bearer token, speak TLS, redirect blobs or fail.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, utimesSync, writeFileSync } from "node:fs";
import http, { type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from "node:http";
import { connect, createServer as createNetServer, type Socket } from "node:net";
import { createServer as createTlsServer, type TlsOptions } from "node:tls";
import { createImageStore, type ImageCache, ImageError, type ImageStoreOptions } from "../../src/host/registry/store.ts";
import { createLogger } from "../../src/log.ts";
import { freePort, rejection, runDir, runOk } from "../harness/exec.ts";
import { writeLayout, type ImageSpec, type LayoutOptions } from "../harness/oci.ts";
import { startRegistry, type Registry } from "../harness/registry.ts";

const base = runDir("image-extract");
let registry: Registry;
const closers: (() => Promise<void>)[] = [];

beforeAll(async () => {
  registry = await startRegistry();
}, 30_000);

afterAll(async () => {
  for (const close of closers.reverse()) await close();
  await registry?.stop();
});

const amd64 = { os: "linux", architecture: "amd64" };
const sha = (data: string | Uint8Array) => createHash("sha256").update(data).digest("hex");

let pushes = 0;
let lastLayout = "";
/** Pushes `images` as REPO:TAG (an index when given a list); the digest the tag points at. */
async function push(repo: string, tag: string, images: ImageSpec | ImageSpec[], opts: LayoutOptions = {}): Promise<string> {
  const layout = `${base}/layout-${++pushes}`;
  lastLayout = layout;
  const written = writeLayout(layout, tag, images, opts);
  const pushed = await registry.push(layout, repo, tag, { all: Array.isArray(images) || opts.alternative !== undefined });
  expect(pushed.digest).toBe(written.root.digest);
  return pushed.digest;
}

type Workspace = { dir: string; hostsDir: string; cacheDir: string };
function workspace(): Workspace {
  const dir = mkdtempSync(`${base}/ws-`);
  return { dir, hostsDir: `${dir}/certs.d`, cacheDir: `${dir}/cache` };
}
function hostsToml(ws: Workspace, registryHost: string, text: string): void {
  mkdirSync(`${ws.hostsDir}/${registryHost}`, { recursive: true });
  writeFileSync(`${ws.hostsDir}/${registryHost}/hosts.toml`, text);
}
function storeFor(ws: Workspace, extra: Partial<ImageStoreOptions> = {}): { store: ImageCache; logs: Record<string, unknown>[] } {
  const logs: Record<string, unknown>[] = [];
  const log = createLogger({ level: "debug", write: (l) => logs.push(JSON.parse(l) as Record<string, unknown>) });
  return { store: createImageStore({ cacheDir: ws.cacheDir, hostsDir: ws.hostsDir, arch: "amd64", log, ...extra }), logs };
}
const imageError = (p: Promise<unknown>) => rejection(p, ImageError);

// --- a proxy in front of the registry: counts requests and misbehaves on demand ---

type Seen = { method: string; path: string; query: string; auth: boolean; headers: IncomingHttpHeaders };
type Proxy = {
  /** "http(s)://127.0.0.1:PORT" */
  url: string;
  seen: Seen[];
  /** TLS connections accepted, each with whether its client presented a certificate. */
  tlsClients: { clientCert: boolean }[];
  /** redirectBlobs: blob GETs are answered 307 to this prefix + the request's path (this proxy's own `${url}/cdn` serves them too). */
  mode: { auth: boolean; redirectBlobs: string | undefined; status: number; realm: string | undefined };
};

/** requestCert: ask clients for a certificate (any is accepted) and record whether one came. */
async function startProxy(tls?: { cert: string; key: string; requestCert?: boolean }): Promise<Proxy> {
  const seen: Seen[] = [];
  const tlsClients: Proxy["tlsClients"] = [];
  const mode: Proxy["mode"] = { auth: false, redirectBlobs: undefined, status: 0, realm: undefined };
  const [upHost, upPort] = registry.host.split(":") as [string, string];
  let self = "";
  const handle = (req: IncomingMessage, res: ServerResponse) => {
    const cdn = req.url?.startsWith("/cdn/") === true;
    if (cdn) req.url = (req.url as string).slice("/cdn".length);
    const u = new URL(req.url ?? "/", "http://x");
    seen.push({ method: req.method ?? "", path: u.pathname, query: u.search, auth: req.headers.authorization !== undefined, headers: req.headers });
    if (mode.status) {
      res.writeHead(mode.status).end();
      return;
    }
    if (u.pathname === "/token") {
      const ok = u.searchParams.get("service") === "test-registry" && /^repository:[a-z0-9/]+:pull$/.test(u.searchParams.get("scope") ?? "");
      res.writeHead(ok ? 200 : 400, { "content-type": "application/json" }).end(JSON.stringify({ token: "anon-token", expires_in: 300 }));
      return;
    }
    if (mode.auth && req.headers.authorization !== "Bearer anon-token") {
      res.writeHead(401, { "www-authenticate": `Bearer realm="${mode.realm ?? self}/token",service="test-registry",scope="repository:whatever:pull"` }).end();
      return;
    }
    if (mode.redirectBlobs !== undefined && !cdn && req.method === "GET" && u.pathname.includes("/blobs/")) {
      res.writeHead(307, { location: `${mode.redirectBlobs}${req.url}` }).end();
      return;
    }
    const up = http.request({ host: upHost, port: Number(upPort), method: req.method, path: req.url, headers: { ...req.headers, host: registry.host } }, (r) => {
      res.writeHead(r.statusCode ?? 502, r.headers);
      r.pipe(res);
    });
    up.on("error", (err) => res.writeHead(502).end(String(err)));
    req.pipe(up);
  };
  const server = http.createServer(handle);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  closers.push(() => new Promise((resolve) => server.close(() => resolve())));
  let port = (server.address() as { port: number }).port;
  if (tls) port = await startTlsFront(port, { ...tls, rejectUnauthorized: false }, tlsClients);
  self = `${tls ? "https" : "http"}://127.0.0.1:${port}`;
  return { url: self, seen, mode, tlsClients };
}

/**
 * TLS in front of the HTTP server on `port` (Bun's https server cannot tell whether a client presented a
 * certificate; its TLS server can); its own port.
 */
async function startTlsFront(port: number, options: TlsOptions, clients: Proxy["tlsClients"]): Promise<number> {
  const sockets = new Set<Socket>();
  const front = createTlsServer(options, (s) => {
    clients.push({ clientCert: Object.keys(s.getPeerCertificate()).length > 0 });
    const up = connect(port, "127.0.0.1");
    for (const x of [s, up]) {
      sockets.add(x);
      x.on("error", () => {
        s.destroy();
        up.destroy();
      });
    }
    s.pipe(up).pipe(s);
  });
  await new Promise<void>((resolve) => front.listen(0, "127.0.0.1", resolve));
  closers.push(() => {
    for (const s of sockets) s.destroy();
    return new Promise((resolve) => front.close(() => resolve()));
  });
  return (front.address() as { port: number }).port;
}

/** Accepts connections and never answers (a hung mirror). */
async function silentServer(): Promise<string> {
  const sockets = new Set<Socket>();
  const server = createNetServer((s) => void sockets.add(s));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  closers.push(() => {
    for (const s of sockets) s.destroy();
    return new Promise((resolve) => server.close(() => resolve()));
  });
  return `http://127.0.0.1:${(server.address() as { port: number }).port}`;
}

const kinds = (seen: Seen[]) => seen.map((s) => `${s.method} ${s.path.includes("/blobs/") ? "blob" : s.path.includes("/manifests/") ? "manifest" : s.path}`);

// An upstream name that never resolves: the mirror is all there is (nothing here ever looks it up).
const upstream = "registry.example.invalid";

describe("mirrors from hosts.toml", () => {
  let proxy: Proxy;
  let digest: string;
  beforeAll(async () => {
    proxy = await startProxy();
    digest = await push("e2e/mirror", "v1", { platform: amd64, layers: [{ "etc/app/config.yaml": "key: value\n", "usr/bin/tool": { content: "#!/bin/sh\necho hi\n", mode: 0o755 } }] });
  }, 60_000);

  test("an image of an unresolvable registry is pulled through its mirror; the cache file is 0600", async () => {
    const ws = workspace();
    hostsToml(ws, upstream, `[host."${proxy.url}"]\n  capabilities = ["pull", "resolve"]\n`);
    const { store } = storeFor(ws);
    const got = await store.extract({ image: `${upstream}/e2e/mirror:v1`, filePathInImage: "/etc/app/config.yaml" });
    expect(got).toEqual({
      image: `${upstream}/e2e/mirror:v1`,
      filePathInImage: "/etc/app/config.yaml",
      manifestDigest: digest,
      sha256: sha("key: value\n"),
      size: 11,
      blobPath: `${ws.cacheDir}/files/sha256/${sha("key: value\n")}`,
      pulled: true,
    });
    expect(readFileSync(got.blobPath, "utf8")).toBe("key: value\n");
    expect(statSync(got.blobPath).mode & 0o777).toBe(0o600);
    expect(statSync(ws.cacheDir).mode & 0o777).toBe(0o700);
    // containerd's mirror protocol: the upstream registry rides along as ?ns=.
    expect(proxy.seen.filter((s) => s.path.startsWith("/v2/e2e/mirror/")).every((s) => s.query === `?ns=${upstream}`)).toBe(true);
    // The path may be given without the leading slash.
    expect((await store.extract({ image: `${upstream}/e2e/mirror:v1`, filePathInImage: "usr/bin/tool" })).sha256).toBe(sha("#!/bin/sh\necho hi\n"));
  });

  test("first mirror down (refused, hung, 503) → the next one is used; the log says which failed", async () => {
    const refused = `http://127.0.0.1:${await freePort()}`;
    const hung = await silentServer();
    const broken = await startProxy();
    broken.mode.status = 503;
    const ws = workspace();
    hostsToml(ws, upstream, [refused, hung, broken.url, proxy.url].map((u) => `[host."${u}"]\n`).join(""));
    const { store, logs } = storeFor(ws, { timeouts: { headersMs: 300 } });
    const started = Date.now();
    const got = await store.extract({ image: `${upstream}/e2e/mirror:v1`, filePathInImage: "etc/app/config.yaml" });
    expect(got.sha256).toBe(sha("key: value\n"));
    expect(Date.now() - started).toBeLessThan(5_000);
    const warnings = logs.filter((l) => l.msg === "registry endpoints failed before another answered");
    expect(warnings).toHaveLength(1); // one line per extraction, not one per request
    const failed = (warnings[0] as { failed: Record<string, string> }).failed;
    expect(Object.keys(failed)).toEqual([`${refused}/v2`, `${hung}/v2`, `${broken.url}/v2`]);
    expect(Object.values(failed).join("\n")).toMatch(/connection refused[^\n]*\nno response within 300 ms\n[^\n]*HTTP 503/);
  });

  test("every endpoint failing: one ImageError listing each endpoint and why", async () => {
    const refused = `http://127.0.0.1:${await freePort()}`;
    const broken = await startProxy();
    broken.mode.status = 500;
    const ws = workspace();
    hostsToml(ws, upstream, `server = "${refused}"\n[host."${broken.url}"]\n`);
    const { store } = storeFor(ws);
    const err = await imageError(store.extract({ image: `${upstream}/e2e/mirror:v1`, filePathInImage: "/etc/app/config.yaml" }));
    expect(err.image).toBe(`${upstream}/e2e/mirror:v1`);
    expect(err.filePathInImage).toBe("/etc/app/config.yaml");
    expect(err.message).toContain(`image ${upstream}/e2e/mirror:v1, file /etc/app/config.yaml: resolving tag v1 failed on every endpoint tried`);
    expect(err.message).toContain(`${broken.url}/v2: manifest v1: HTTP 500`);
    expect(err.message).toContain(`${refused}/v2: connection refused`);
  });

  test("a host without the resolve capability is used only for content by digest", async () => {
    const pullOnly = await startProxy();
    const resolver = await startProxy();
    const ws = workspace();
    hostsToml(ws, upstream, `[host."${pullOnly.url}"]\n  capabilities = ["pull"]\n[host."${resolver.url}"]\n  capabilities = ["pull", "resolve"]\n`);
    const { store } = storeFor(ws);
    await store.extract({ image: `${upstream}/e2e/mirror:v1`, filePathInImage: "etc/app/config.yaml" });
    expect(kinds(resolver.seen)).toEqual(["HEAD manifest"]);
    expect(kinds(pullOnly.seen)).toEqual(["GET manifest", "GET blob", "GET blob"]); // manifest by digest, config, layer
    expect(pullOnly.seen.every((s) => !s.path.endsWith("/manifests/v1"))).toBe(true);
  });

  test("anonymous bearer tokens: a 401 challenge is answered with a token request", async () => {
    const guarded = await startProxy();
    guarded.mode.auth = true;
    const ws = workspace();
    hostsToml(ws, upstream, `[host."${guarded.url}"]\n`);
    const { store } = storeFor(ws);
    expect((await store.extract({ image: `${upstream}/e2e/mirror:v1`, filePathInImage: "etc/app/config.yaml" })).pulled).toBe(true);
    expect(kinds(guarded.seen).slice(0, 3)).toEqual(["HEAD manifest", "GET /token", "HEAD manifest"]);
    expect(guarded.seen.filter((s) => s.path.startsWith("/v2/")).slice(1).every((s) => s.auth)).toBe(true);
    expect(kinds(guarded.seen).filter((k) => k === "GET /token")).toHaveLength(1); // the token is reused
  });

  test("blob redirects are followed (registries hand blobs to a CDN)", async () => {
    const redirecting = await startProxy();
    redirecting.mode.redirectBlobs = `http://${registry.host}`;
    const ws = workspace();
    hostsToml(ws, upstream, `[host."${redirecting.url}"]\n`);
    const { store } = storeFor(ws);
    expect((await store.extract({ image: `${upstream}/e2e/mirror:v1`, filePathInImage: "etc/app/config.yaml" })).sha256).toBe(sha("key: value\n"));
    expect(kinds(redirecting.seen)).toContain("GET blob");
  });
});

type Pki = {
  caFile: string;
  /** For 127.0.0.1, signed by the CA. */
  server: { cert: string; key: string };
  /** For 127.0.0.1, signed by nobody. */
  selfSigned: { cert: string; key: string };
  /** A client certificate's files (self-signed: the servers here accept any and only record it). */
  client: { certFile: string; keyFile: string };
};
let pki: Promise<Pki> | undefined;
function testPki(): Promise<Pki> {
  pki ??= (async () => {
    const dir = `${base}/tls`;
    mkdirSync(dir, { recursive: true });
    const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    const ip = ["-addext", "subjectAltName=IP:127.0.0.1"];
    await runOk(["openssl", "req", "-x509", ...ec, "-keyout", `${dir}/ca.key`, "-out", `${dir}/ca.crt`, "-subj", "/CN=trellis test CA", "-days", "2"]);
    await runOk(["openssl", "req", ...ec, "-keyout", `${dir}/srv.key`, "-out", `${dir}/srv.csr`, "-subj", "/CN=127.0.0.1"]);
    writeFileSync(`${dir}/ext.cnf`, "subjectAltName=IP:127.0.0.1\n");
    await runOk(["openssl", "x509", "-req", "-in", `${dir}/srv.csr`, "-CA", `${dir}/ca.crt`, "-CAkey", `${dir}/ca.key`, "-CAcreateserial", "-out", `${dir}/srv.crt`, "-days", "2", "-extfile", `${dir}/ext.cnf`]);
    await runOk(["openssl", "req", "-x509", ...ec, ...ip, "-keyout", `${dir}/self.key`, "-out", `${dir}/self.crt`, "-subj", "/CN=127.0.0.1", "-days", "2"]);
    await runOk(["openssl", "req", "-x509", ...ec, "-keyout", `${dir}/client.key`, "-out", `${dir}/client.crt`, "-subj", "/CN=node", "-days", "2"]);
    const pair = (name: string) => ({ cert: readFileSync(`${dir}/${name}.crt`, "utf8"), key: readFileSync(`${dir}/${name}.key`, "utf8") });
    return { caFile: `${dir}/ca.crt`, server: pair("srv"), selfSigned: pair("self"), client: { certFile: `${dir}/client.crt`, keyFile: `${dir}/client.key` } };
  })();
  return pki;
}

describe("TLS endpoints", () => {
  let proxy: Proxy;
  let caFile: string;
  beforeAll(async () => {
    const { caFile: ca, server } = await testPki();
    caFile = ca;
    proxy = await startProxy(server);
    await push("e2e/tls", "v1", { platform: amd64, layers: [{ "etc/tls.txt": "over tls\n" }] });
  }, 60_000);

  test("verified against the hosts.toml `ca` (relative path), refused without it, accepted with skip_verify", async () => {
    const ws = workspace();
    const image = { image: `${upstream}/e2e/tls:v1`, filePathInImage: "/etc/tls.txt" };
    mkdirSync(`${ws.hostsDir}/${upstream}`, { recursive: true });
    writeFileSync(`${ws.hostsDir}/${upstream}/my-ca.crt.pem`, readFileSync(caFile));
    const closed = `http://127.0.0.1:${await freePort()}`;

    hostsToml(ws, upstream, `server = "${closed}"\n[host."${proxy.url}"]\n  ca = "my-ca.crt.pem"\n`);
    expect((await storeFor(ws).store.extract(image)).sha256).toBe(sha("over tls\n"));

    hostsToml(ws, upstream, `server = "${closed}"\n[host."${proxy.url}"]\n`);
    const err = await imageError(storeFor({ ...ws, cacheDir: `${ws.dir}/cache2` }).store.extract(image));
    expect(err.message).toContain(`${proxy.url}/v2: TLS certificate not trusted`);

    hostsToml(ws, upstream, `server = "${closed}"\n[host."${proxy.url}"]\n  skip_verify = true\n`);
    expect((await storeFor({ ...ws, cacheDir: `${ws.dir}/cache3` }).store.extract(image)).pulled).toBe(true);
  });
});

// A mirror that hands blobs to a server on another origin (as registries hand them to a CDN): what
// hosts.toml configures for the mirror is the mirror's alone.
describe("credentials stay with their host", () => {
  const image = { image: `${upstream}/e2e/redirect:v1`, filePathInImage: "/etc/redirected" };
  const content = "via a redirect\n";
  beforeAll(() => push("e2e/redirect", "v1", { platform: amd64, layers: [{ "etc/redirected": content }] }), 60_000);

  const blobGets = (p: Proxy) => p.seen.filter((s) => s.method === "GET" && s.path.includes("/blobs/"));
  const secret = "Basic bWlycm9yOnMzY3JldA==";

  test("hosts.toml headers and the bearer token reach the mirror, never a redirect target on another origin; a same-origin redirect keeps them", async () => {
    const mirror = await startProxy();
    const cdn = await startProxy();
    mirror.mode.redirectBlobs = cdn.url;
    const ws = workspace();
    hostsToml(ws, upstream, `[host."${mirror.url}"]\n  [host."${mirror.url}".header]\n    Authorization = "${secret}"\n    X-Mirror-Key = ["k1"]\n`);
    expect((await storeFor(ws).store.extract(image)).sha256).toBe(sha(content));
    expect(mirror.seen.length).toBeGreaterThanOrEqual(3);
    for (const s of mirror.seen) expect([s.headers.authorization, s.headers["x-mirror-key"]]).toEqual([secret, "k1"]);
    expect(blobGets(mirror)).toHaveLength(2); // config and layer, both redirected
    expect(blobGets(cdn)).toHaveLength(2);
    for (const s of cdn.seen) expect([s.headers.authorization, s.headers["x-mirror-key"]]).toEqual([undefined, undefined]);

    // The mirror's anonymous bearer token stays with the mirror too, and a token realm on another origin
    // gets none of the mirror's headers.
    const guarded = await startProxy();
    const cdn2 = await startProxy();
    const realm = await startProxy();
    guarded.mode.auth = true;
    guarded.mode.redirectBlobs = cdn2.url;
    guarded.mode.realm = realm.url;
    hostsToml(ws, upstream, `[host."${guarded.url}"]\n  [host."${guarded.url}".header]\n    X-Mirror-Key = "k2"\n`);
    expect((await storeFor({ ...ws, cacheDir: `${ws.dir}/cache2` }).store.extract(image)).pulled).toBe(true);
    expect(blobGets(guarded).every((s) => s.headers.authorization === "Bearer anon-token" && s.headers["x-mirror-key"] === "k2")).toBe(true);
    expect(blobGets(cdn2)).toHaveLength(2);
    expect(cdn2.seen.every((s) => !s.auth && s.headers["x-mirror-key"] === undefined)).toBe(true);
    expect(kinds(realm.seen)).toEqual(["GET /token"]);
    expect(realm.seen[0]?.headers["x-mirror-key"]).toBeUndefined();

    // Redirected within the mirror's own origin: still the mirror, so the headers go along.
    const own = await startProxy();
    own.mode.redirectBlobs = `${own.url}/cdn`;
    hostsToml(ws, upstream, `[host."${own.url}"]\n  [host."${own.url}".header]\n    Authorization = "${secret}"\n`);
    expect((await storeFor({ ...ws, cacheDir: `${ws.dir}/cache3` }).store.extract(image)).pulled).toBe(true);
    expect(blobGets(own)).toHaveLength(4); // each blob: the redirect, then /cdn
    expect(own.seen.every((s) => s.headers.authorization === secret)).toBe(true);
  });

  test("client certificates and skip_verify apply to the host that names them, not to a redirect target", async () => {
    const { caFile, server, selfSigned, client } = await testPki();
    const mirror = await startProxy({ ...server, requestCert: true });
    const cdn = await startProxy({ ...server, requestCert: true });
    mirror.mode.redirectBlobs = cdn.url;
    const ws = workspace();
    hostsToml(ws, upstream, `[host."${mirror.url}"]\n  ca = "${caFile}"\n  client = [["${client.certFile}", "${client.keyFile}"]]\n`);
    expect((await storeFor(ws).store.extract(image)).pulled).toBe(true);
    expect(mirror.seen.length).toBeGreaterThanOrEqual(3);
    expect(mirror.tlsClients.length).toBeGreaterThanOrEqual(3);
    expect(mirror.tlsClients.every((c) => c.clientCert)).toBe(true);
    expect(blobGets(cdn)).toHaveLength(2); // the `ca` verified it, as containerd's shared transport would
    expect(cdn.tlsClients.length).toBeGreaterThanOrEqual(2);
    expect(cdn.tlsClients.some((c) => c.clientCert)).toBe(false);

    // skip_verify lets the mirror's certificate (whose CA is not configured here) through, not a self-signed redirect target's.
    const untrusted = await startProxy(selfSigned);
    mirror.mode.redirectBlobs = untrusted.url;
    hostsToml(ws, upstream, `[host."${mirror.url}"]\n  skip_verify = true\n`);
    const err = await imageError(storeFor({ ...ws, cacheDir: `${ws.dir}/cache2` }).store.extract(image));
    expect(err.message).toContain(`${mirror.url}/v2: redirected to ${untrusted.url}/v2/e2e/redirect/blobs/sha256:`);
    expect(err.message).toContain("TLS certificate not trusted (self-signed)");
    expect(untrusted.seen).toEqual([]); // the handshake failed: no request was sent
    expect(readdirSync(`${ws.dir}/cache2/files/sha256`)).toEqual([]);
  });
});

describe("caching", () => {
  test("a tag is resolved on every call: unchanged → one HEAD and pulled:false; moved → the new content", async () => {
    const proxy = await startProxy();
    await push("e2e/moving", "stable", { platform: amd64, layers: [{ "etc/version": "1\n" }] });
    const ws = workspace();
    hostsToml(ws, upstream, `[host."${proxy.url}"]\n`);
    const { store } = storeFor(ws);
    const req = { image: `${upstream}/e2e/moving:stable`, filePathInImage: "/etc/version" };

    const first = await store.extract(req);
    expect(first).toMatchObject({ sha256: sha("1\n"), pulled: true });
    proxy.seen.length = 0;
    const again = await store.extract(req);
    expect(again).toEqual({ ...first, pulled: false });
    expect(kinds(proxy.seen)).toEqual(["HEAD manifest"]);

    const moved = await push("e2e/moving", "stable", { platform: amd64, layers: [{ "etc/version": "2\n" }] });
    proxy.seen.length = 0;
    const second = await store.extract(req);
    expect(second).toMatchObject({ sha256: sha("2\n"), manifestDigest: moved, pulled: true });
    expect(second.manifestDigest).not.toBe(first.manifestDigest);
    expect(readFileSync(second.blobPath, "utf8")).toBe("2\n");
    expect(kinds(proxy.seen)).toEqual(["HEAD manifest", "GET manifest", "GET blob", "GET blob"]);

    // A second store over the same cache directory (the agent restarted) knows it too.
    proxy.seen.length = 0;
    expect((await storeFor(ws).store.extract(req)).pulled).toBe(false);
    expect(kinds(proxy.seen)).toEqual(["HEAD manifest"]);
  });

  test("digest-pinned and cached: no request at all (not even hosts.toml is read)", async () => {
    const proxy = await startProxy();
    const digest = await push("e2e/pinned", "v1", { platform: amd64, layers: [{ "opt/pinned": "pinned\n" }] });
    const ws = workspace();
    hostsToml(ws, upstream, `[host."${proxy.url}"]\n`);
    const { store } = storeFor(ws);
    const req = { image: `${upstream}/e2e/pinned:v1@${digest}`, filePathInImage: "opt/pinned" };
    expect((await store.extract(req)).pulled).toBe(true);
    expect(kinds(proxy.seen)).toEqual(["GET manifest", "GET blob", "GET blob"]); // by digest: no HEAD of the tag
    proxy.seen.length = 0;
    hostsToml(ws, upstream, "this is = not [valid toml");
    expect(await store.extract(req)).toMatchObject({ pulled: false, manifestDigest: digest, sha256: sha("pinned\n") });
    expect(proxy.seen).toEqual([]);
  });

  test("adopt: a file on the node taken in as the file of the image install.sh took (zstd, or the gzip alternative): extracted by tag with one HEAD, no layer pulled; a file that is not the content is refused", async () => {
    const proxy = await startProxy();
    const content = "#!/bin/sh\necho agent\n";
    // As build/image.ts writes it: the zstd image first, the same image with a gzip layer after it.
    const index = await push("e2e/agent", "v1", { platform: amd64, layers: [{ "gardener-node-agent": { content, mode: 0o755 } }] }, { compression: "zstd", alternative: { compression: "gzip" } });
    const [zstdManifest, gzipManifest] = (JSON.parse(readFileSync(`${lastLayout}/blobs/sha256/${index.slice(7)}`, "utf8")) as { manifests: { digest: string }[] }).manifests.map((m) => m.digest);
    const ws = workspace();
    hostsToml(ws, upstream, `[host."${proxy.url}"]\n`);
    const { store } = storeFor(ws);
    const source = `${ws.dir}/gardener-node-agent`;
    writeFileSync(source, content, { mode: 0o755 });
    const file = { index, manifest: zstdManifest as string, path: "/gardener-node-agent", source };

    expect(await store.adopt({ ...file, sha256: sha("what install.sh recorded, but not what is there\n") })).toBe(false);
    expect(readdirSync(`${ws.cacheDir}/files/sha256`)).toEqual([]);
    expect(existsSync(`${ws.cacheDir}/index.json`)).toBe(false);

    expect(await store.adopt({ ...file, sha256: sha(content) })).toBe(true);
    const got = await store.extract({ image: `${upstream}/e2e/agent:v1`, filePathInImage: "/gardener-node-agent" });
    expect(got).toMatchObject({ pulled: false, sha256: sha(content), manifestDigest: zstdManifest });
    expect(readFileSync(got.blobPath, "utf8")).toBe(content);
    expect(statSync(got.blobPath).mode & 0o777).toBe(0o600);
    expect(kinds(proxy.seen)).toEqual(["HEAD manifest"]);

    // Taken as the gzip image's file (install.sh on a machine without zstd): the index's image for this
    // platform is the one install.sh took, and the store uses it too rather than pull the first entry's.
    const other = workspace();
    hostsToml(other, upstream, `[host."${proxy.url}"]\n`);
    const second = storeFor(other).store;
    expect(await second.adopt({ ...file, manifest: gzipManifest as string, sha256: sha(content) })).toBe(true);
    proxy.seen.length = 0;
    expect(await second.extract({ image: `${upstream}/e2e/agent:v1`, filePathInImage: "/gardener-node-agent" })).toMatchObject({ pulled: false, manifestDigest: gzipManifest });
    expect(kinds(proxy.seen)).toEqual(["HEAD manifest"]);
    // Another file of that image comes from the same (gzip) image.
    expect((await second.extract({ image: `${upstream}/e2e/agent:v1`, filePathInImage: "/missing" }).catch((e: Error) => e.message))).toContain(`not found in any of the 1 layer(s) of ${gzipManifest}`);
  });

  test("prune drops files not kept and their index entries; a pruned file is pulled again", async () => {
    const proxy = await startProxy();
    await push("e2e/prune", "v1", { platform: amd64, layers: [{ "a.txt": "keep me\n", "b.txt": "drop me\n" }] });
    const ws = workspace();
    hostsToml(ws, upstream, `[host."${proxy.url}"]\n`);
    const { store } = storeFor(ws);
    const a = await store.extract({ image: `${upstream}/e2e/prune:v1`, filePathInImage: "a.txt" });
    const b = await store.extract({ image: `${upstream}/e2e/prune:v1`, filePathInImage: "b.txt" });
    writeFileSync(`${ws.cacheDir}/files/sha256/${"0".repeat(64)}`, "orphan"); // e.g. left by a crash before the index write
    await store.prune(new Set([a.sha256]));
    expect(readdirSync(`${ws.cacheDir}/files/sha256`)).toEqual([a.sha256]);
    const index = JSON.parse(readFileSync(`${ws.cacheDir}/index.json`, "utf8")) as { files: Record<string, Record<string, unknown>> };
    expect(Object.keys(index.files[a.manifestDigest] ?? {})).toEqual(["a.txt"]);
    expect((await store.extract({ image: `${upstream}/e2e/prune:v1`, filePathInImage: "a.txt" })).pulled).toBe(false);
    expect((await store.extract({ image: `${upstream}/e2e/prune:v1`, filePathInImage: "b.txt" })).pulled).toBe(true);
    expect(existsSync(b.blobPath)).toBe(true);
  });
});

describe("the cache's bound", () => {
  test("over maxCacheBytes the least recently used files go (a cache hit counts as a use); the files one OSC uses are never evicted for each other: refused when they do not fit", async () => {
    const proxy = await startProxy();
    const content = { a: "file a ...\n", b: "file b ...\n", c: "file c ...\n", d: "file d ...\n" }; // 11 bytes each
    await push("e2e/capped", "v1", { platform: amd64, layers: [content] });
    const ws = workspace();
    hostsToml(ws, upstream, `[host."${proxy.url}"]\n`);
    const { store, logs } = storeFor(ws, { maxCacheBytes: 25 });
    const get = (name: keyof typeof content, inUse?: Set<string>) => store.extract({ image: `${upstream}/e2e/capped:v1`, filePathInImage: name }, inUse ? { inUse } : {});
    const files = `${ws.cacheDir}/files/sha256`;
    const cached = () => readdirSync(files).sort();
    const sorted = (...names: (keyof typeof content)[]) => names.map((n) => sha(content[n])).sort();

    await get("a");
    await get("b");
    expect(cached()).toEqual(sorted("a", "b"));
    // a is the older file, but used again since b was made.
    const hourAgo = new Date(Date.now() - 3_600_000);
    utimesSync(`${files}/${sha(content.a)}`, hourAgo, hourAgo);
    utimesSync(`${files}/${sha(content.b)}`, new Date(Date.now() - 1_800_000), new Date(Date.now() - 1_800_000));
    expect((await get("a")).pulled).toBe(false);
    expect(statSync(`${files}/${sha(content.a)}`).mtimeMs).toBeGreaterThan(Date.now() - 60_000);

    await get("c"); // 33 bytes would be over 25: b, the least recently used, goes
    expect(cached()).toEqual(sorted("a", "c"));
    expect(readFileSync(`${ws.cacheDir}/index.json`, "utf8")).not.toContain('"b"');
    expect(logs.find((l) => l.msg === "evicted least recently used files from the image cache")).toMatchObject({ evicted: 1, limitBytes: 25, bytes: 22 });
    expect((await get("b")).pulled).toBe(true); // evicted: fetched again, in a's place
    expect(cached()).toEqual(sorted("b", "c"));

    // One OSC's files: c (a hit) and d fit together, a third does not, and nothing of theirs is evicted for it.
    const inUse = new Set<string>();
    expect((await get("c", inUse)).pulled).toBe(false);
    expect((await get("d", inUse)).pulled).toBe(true);
    expect(cached()).toEqual(sorted("c", "d"));
    const err = await imageError(get("a", inUse));
    expect(err.message).toBe(
      `image ${upstream}/e2e/capped:v1, file a: image cache ${ws.cacheDir}: the cache holds at most 25 bytes of image files: this file (11 bytes) and the 2 other file(s) this OSC uses (22 bytes) do not fit`,
    );
    expect(readdirSync(files).sort()).toEqual(sorted("c", "d")); // no temp file left either
    expect([...inUse].sort()).toEqual(sorted("c", "d"));
  });
});

describe("image formats", () => {
  test("an index with amd64 and arm64: each node gets its own architecture's file", async () => {
    const proxy = await startProxy();
    const index = await push("e2e/multiarch", "v1", [
      { platform: { os: "linux", architecture: "amd64" }, layers: [{ "bin/tool": "amd64 build\n" }] },
      { platform: { os: "linux", architecture: "arm64", variant: "v8" }, layers: [{ "bin/tool": "arm64 build\n" }] },
    ]);
    const ws = workspace();
    hostsToml(ws, upstream, `[host."${proxy.url}"]\n`);
    const req = { image: `${upstream}/e2e/multiarch:v1`, filePathInImage: "/bin/tool" };
    const amd = await storeFor(ws).store.extract(req);
    const arm = await storeFor(ws, { arch: "arm64" }).store.extract(req);
    expect(readFileSync(amd.blobPath, "utf8")).toBe("amd64 build\n");
    expect(readFileSync(arm.blobPath, "utf8")).toBe("arm64 build\n");
    expect(amd.manifestDigest).not.toBe(index);
    expect(arm.manifestDigest).not.toBe(amd.manifestDigest);
    // Pinned to the index digest, the cached platform manifest is found without a request.
    proxy.seen.length = 0;
    expect((await storeFor(ws, { arch: "arm64" }).store.extract({ ...req, image: `${upstream}/e2e/multiarch@${index}` })).pulled).toBe(false);
    expect(proxy.seen).toEqual([]);
  });

  test("a single-platform image for another architecture is refused", async () => {
    await push("e2e/armonly", "v1", { platform: { os: "linux", architecture: "arm64" }, layers: [{ x: "arm\n" }] });
    const ws = workspace();
    hostsToml(ws, upstream, `[host."http://${registry.host}"]\n`);
    const err = await imageError(storeFor(ws).store.extract({ image: `${upstream}/e2e/armonly:v1`, filePathInImage: "x" }));
    expect(err.message).toContain("is for linux/arm64, this node is linux/amd64");
  });

  for (const compression of ["gzip", "zstd"] as const) {
    test(`${compression} layers, several of them: the topmost layer with the file wins`, async () => {
      await push(`e2e/${compression}`, "v1", { platform: amd64, layers: [{ "etc/conf": "bottom\n", "etc/only-bottom": "b\n" }, { "etc/other": "o\n" }, { "etc/conf": "top\n" }] }, { compression });
      const ws = workspace();
      hostsToml(ws, upstream, `[host."http://${registry.host}"]\n`);
      const { store } = storeFor(ws);
      const image = `${upstream}/e2e/${compression}:v1`;
      expect(readFileSync((await store.extract({ image, filePathInImage: "/etc/conf" })).blobPath, "utf8")).toBe("top\n");
      expect(readFileSync((await store.extract({ image, filePathInImage: "/etc/only-bottom" })).blobPath, "utf8")).toBe("b\n");
    });
  }

  test("whiteouts in an upper layer: the file is deleted (its own, its directory's, an opaque directory)", async () => {
    await push("e2e/whiteout", "v1", {
      platform: amd64,
      layers: [
        { "etc/a": "a\n", "etc/b": "b\n", "opt/x/y": "y\n", "srv/d/f": "f\n", "keep/k": "k\n" },
        { "etc/.wh.b": "", "opt/.wh.x": "", "srv/d/.wh..wh..opq": "", "srv/d/new": "new\n" },
        { "unrelated": "u\n" },
      ],
    });
    const ws = workspace();
    hostsToml(ws, upstream, `[host."http://${registry.host}"]\n`);
    const { store } = storeFor(ws);
    const image = `${upstream}/e2e/whiteout:v1`;
    for (const path of ["/etc/b", "/opt/x/y", "/srv/d/f"]) {
      const err = await imageError(store.extract({ image, filePathInImage: path }));
      expect(err.message).toContain(`image ${image}, file ${path}: file deleted in layer 2 of 3`);
    }
    expect(readFileSync((await store.extract({ image, filePathInImage: "/etc/a" })).blobPath, "utf8")).toBe("a\n");
    expect(readFileSync((await store.extract({ image, filePathInImage: "/srv/d/new" })).blobPath, "utf8")).toBe("new\n");
  });
});

describe("failures", () => {
  test("a missing image (404) and a missing path: ImageError naming image and path", async () => {
    await push("e2e/present", "v1", { platform: amd64, layers: [{ "etc/there": "x" }] });
    const ws = workspace();
    hostsToml(ws, upstream, `server = "http://127.0.0.1:${await freePort()}"\n[host."http://${registry.host}"]\n`);
    const { store } = storeFor(ws);

    const missing = await imageError(store.extract({ image: `${upstream}/e2e/absent:v1`, filePathInImage: "/etc/there" }));
    expect(missing.message).toContain(`image ${upstream}/e2e/absent:v1, file /etc/there: resolving tag v1 failed on every endpoint tried`);
    expect(missing.message).toContain(`http://${registry.host}/v2: manifest v1: HTTP 404 not found`);

    const noTag = await imageError(store.extract({ image: `${upstream}/e2e/present:v2`, filePathInImage: "/etc/there" }));
    expect(noTag.message).toContain("HTTP 404");

    const noPath = await imageError(store.extract({ image: `${upstream}/e2e/present:v1`, filePathInImage: "/etc/missing" }));
    expect(noPath.message).toMatch(new RegExp(`^image ${upstream}/e2e/present:v1, file /etc/missing: etc/missing not found in any of the 1 layer\\(s\\) of sha256:`));

    const dir = await imageError(store.extract({ image: `${upstream}/e2e/present:v1`, filePathInImage: "/etc" }));
    expect(dir.message).toContain("it is a directory in layer 1 of 1");

    const bad = await imageError(store.extract({ image: `${upstream}/e2e/present:v1`, filePathInImage: "/etc/../etc/there" }));
    expect(bad.message).toContain('must not contain ".."');
    const badRef = await imageError(store.extract({ image: `${upstream}/e2e/UPPER:v1`, filePathInImage: "/x" }));
    expect(badRef.message).toContain("invalid image reference");
  });

  test("a file over maxFileBytes is refused with the sizes", async () => {
    await push("e2e/sized", "v1", { platform: amd64, layers: [{ "big": "0123456789" }] });
    const ws = workspace();
    hostsToml(ws, upstream, `[host."http://${registry.host}"]\n`);
    const err = await imageError(storeFor(ws, { maxFileBytes: 9 }).store.extract({ image: `${upstream}/e2e/sized:v1`, filePathInImage: "big" }));
    expect(err.message).toContain("big is 10 bytes, more than the limit of 9 bytes");
  });

  test("a layer unpacking to more than maxUnpackedLayerBytes (a gzip bomb) is refused naming image, file and layer; nothing enters the cache", async () => {
    const layout = `${base}/layout-bomb`;
    const written = writeLayout(layout, "v1", { platform: amd64, layers: [{ "opt/zeros": { content: new Uint8Array(32 << 20), mode: 0o644 }, "etc/small": "small\n" }] });
    await registry.push(layout, "e2e/bomb", "v1");
    const layer = (written.images[0]?.layers[0] as { digest: string; size: number }).digest;
    const ws = workspace();
    hostsToml(ws, upstream, `[host."http://${registry.host}"]\n`);
    const err = await imageError(storeFor(ws, { maxUnpackedLayerBytes: 1 << 20 }).store.extract({ image: `${upstream}/e2e/bomb:v1`, filePathInImage: "/etc/small" }));
    expect(err.message).toStartWith(`image ${upstream}/e2e/bomb:v1, file /etc/small: layer ${layer} unpacks to more than 1048576 bytes, the limit for one layer`);
    expect(readdirSync(`${ws.cacheDir}/files/sha256`)).toEqual([]);
    expect((await storeFor(ws).store.extract({ image: `${upstream}/e2e/bomb:v1`, filePathInImage: "/etc/small" })).sha256).toBe(sha("small\n"));
    rmSync(layout, { recursive: true, force: true });
  });

  test("a corrupted blob in the registry's storage: digest mismatch named, nothing enters the cache", async () => {
    const repo = "e2e/corrupt";
    const layout = `${base}/layout-corrupt`;
    const written = writeLayout(layout, "v1", { platform: amd64, layers: [{ "etc/secret": "the real content\n" }] });
    await registry.push(layout, repo, "v1");
    const layer = (written.images[0]?.layers[0] as { digest: string }).digest;
    const hex = layer.slice("sha256:".length);
    const data = `${registry.dataDir}/docker/registry/v2/blobs/sha256/${hex.slice(0, 2)}/${hex}/data`;
    const bytes = readFileSync(data);
    bytes[bytes.length >> 1] = (bytes[bytes.length >> 1] as number) ^ 0xff; // same size, other bytes
    writeFileSync(data, bytes);

    const ws = workspace();
    hostsToml(ws, upstream, `[host."http://${registry.host}"]\n`);
    const err = await imageError(storeFor(ws).store.extract({ image: `${upstream}/${repo}:v1`, filePathInImage: "/etc/secret" }));
    expect(err.message).toContain(`http://${registry.host}/v2: digest mismatch: expected ${layer}, got sha256:${sha(bytes)}`);
    expect(readdirSync(`${ws.cacheDir}/files/sha256`)).toEqual([]); // not even a temp file
    expect(existsSync(`${ws.cacheDir}/index.json`) ? readFileSync(`${ws.cacheDir}/index.json`, "utf8") : "").not.toContain("etc/secret");
  });

  test("an aborted extract stops with an ImageError", async () => {
    await push("e2e/abort", "v1", { platform: amd64, layers: [{ x: "x" }] });
    const ws = workspace();
    hostsToml(ws, upstream, `[host."http://${registry.host}"]\n`);
    const controller = new AbortController();
    controller.abort(new Error("shutting down"));
    const err = await imageError(storeFor(ws).store.extract({ image: `${upstream}/e2e/abort:v1`, filePathInImage: "x" }, { signal: controller.signal }));
    expect(err.message).toContain("aborted: shutting down");
  });
});

test("a 100 MB file is streamed through: timed, and its memory stays well under the file's size", async () => {
  const content = randomBytes(100 << 20);
  await push("e2e/big", "v1", { platform: amd64, layers: [{ "opt/big.bin": { content, mode: 0o755 } }] }, { level: 1 });
  const ws = workspace();
  hostsToml(ws, upstream, `[host."http://${registry.host}"]\n`);
  const req = { image: `${upstream}/e2e/big:v1`, filePathInImage: "/opt/big.bin" };

  const started = performance.now();
  const got = await storeFor(ws).store.extract(req);
  const ms = performance.now() - started;
  expect(got).toMatchObject({ size: content.length, sha256: sha(content), pulled: true });
  expect(statSync(got.blobPath).size).toBe(content.length);

  // Again in a process of its own (the bench's child mode), where the peak RSS is the extraction's alone:
  // compared with a run served from the cache, a pull that held the file or the layer would add ≥ 100 MiB.
  type Run = { ms: number; pulled: boolean; sha256: string; maxRssMiB: number };
  const child = async (cacheDir: string) =>
    JSON.parse(await runOk(["bun", `${import.meta.dir}/../bench/image-extract.ts`, "--child", cacheDir, ws.hostsDir, req.image, req.filePathInImage])) as Run;
  const cold = await child(`${ws.dir}/cache-child`);
  const warm = await child(`${ws.dir}/cache-child`);
  expect([cold.pulled, warm.pulled, cold.sha256]).toEqual([true, false, sha(content)]);
  console.log(
    `100 MiB file pulled and extracted in ${ms.toFixed(0)} ms in the test process, ${cold.ms.toFixed(0)} ms in a fresh process ` +
      `(peak RSS ${cold.maxRssMiB.toFixed(0)} MiB, ${warm.maxRssMiB.toFixed(0)} MiB when served from the cache)`,
  );
  expect(cold.maxRssMiB - warm.maxRssMiB).toBeLessThan(100);
  expect(ms).toBeLessThan(20_000);
  // The run directory stays for post-mortems, without its 100 MiB copies.
  rmSync(lastLayout, { recursive: true, force: true });
  rmSync(ws.dir, { recursive: true, force: true });
}, 120_000);
