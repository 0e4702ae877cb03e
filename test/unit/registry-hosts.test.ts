// containerd's certs.d semantics (src/host/registry/hosts.ts): hosts.toml → ordered endpoints, and which
// directory is read for a registry.
import { describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { createFiles } from "../../src/host/files.ts";
import { defaultServer, HostsConfigError, hostDirCandidates, loadEndpoints, maxHostsFileBytes, parseHostsToml, type EndpointConfig } from "../../src/host/registry/hosts.ts";

const files = createFiles("/");
import { runDir } from "../harness/exec.ts";

const all = ["pull", "push", "resolve"];
const brief = (e: EndpointConfig) => ({
  url: `${e.origin}${e.path}`,
  caps: [...e.capabilities].sort() as string[],
  skipVerify: e.skipVerify,
  ca: e.caFiles,
  ...(e.clientPairs.length ? { client: e.clientPairs } : {}),
  ...(Object.keys(e.headers).length ? { headers: e.headers } : {}),
});

describe("parseHostsToml", () => {
  const table: { name: string; registry?: string; toml: string; want: ReturnType<typeof brief>[] }[] = [
    {
      name: "empty file: the default server",
      toml: "",
      want: [{ url: "https://reg.example/v2", caps: all, skipVerify: false, ca: [] }],
    },
    {
      name: "docker.io's default server is registry-1.docker.io",
      registry: "docker.io",
      toml: "# nothing\n",
      want: [{ url: "https://registry-1.docker.io/v2", caps: all, skipVerify: false, ca: [] }],
    },
    {
      name: "mirrors in file order, then server",
      toml: `server = "https://upstream.example"
[host."http://127.0.0.1:5001"]
  capabilities = ["pull", "resolve"]
[host."https://b.example:8443"]
  capabilities = ["pull"]
  skip_verify = true
[host."a.example"]
  ca = "certs/a.pem"
`,
      want: [
        { url: "http://127.0.0.1:5001/v2", caps: ["pull", "resolve"], skipVerify: false, ca: [] },
        { url: "https://b.example:8443/v2", caps: ["pull"], skipVerify: true, ca: [] },
        { url: "https://a.example/v2", caps: all, skipVerify: false, ca: ["/etc/containerd/certs.d/reg.example/certs/a.pem"] },
        { url: "https://upstream.example/v2", caps: all, skipVerify: false, ca: [] },
      ],
    },
    {
      name: "top-level TLS settings belong to the server; server without scheme is https",
      toml: `server = "upstream.example:5000"
ca = ["/x/ca1.pem", "rel/ca2.pem"]
skip_verify = true
capabilities = ["pull"]
`,
      want: [{ url: "https://upstream.example:5000/v2", caps: ["pull"], skipVerify: true, ca: ["/x/ca1.pem", "/etc/containerd/certs.d/reg.example/rel/ca2.pem"] }],
    },
    {
      name: "no server: the default one, with every capability but the file's TLS settings",
      toml: `capabilities = ["pull"]
skip_verify = true
[host."http://m.example"]
`,
      want: [
        { url: "http://m.example/v2", caps: all, skipVerify: false, ca: [] },
        { url: "https://reg.example/v2", caps: all, skipVerify: true, ca: [] },
      ],
    },
    {
      name: "paths: /v2 appended unless present; override_path uses the path as it is",
      toml: `[host."https://m.example/proxy/"]
[host."https://n.example/x/v2"]
[host."https://o.example/api/registry"]
  override_path = true
[host."https://p.example"]
  override_path = true
`,
      want: [
        { url: "https://m.example/proxy/v2", caps: all, skipVerify: false, ca: [] },
        { url: "https://n.example/x/v2", caps: all, skipVerify: false, ca: [] },
        { url: "https://o.example/api/registry", caps: all, skipVerify: false, ca: [] },
        { url: "https://p.example", caps: all, skipVerify: false, ca: [] },
        { url: "https://reg.example/v2", caps: all, skipVerify: false, ca: [] },
      ],
    },
    {
      name: "client certificates and headers",
      toml: `[host."https://m.example"]
  client = [["c.pem", "/k.pem"], "both.pem"]
  [host."https://m.example".header]
    x-one = "1"
    x-many = ["a", "b"]
`,
      want: [
        {
          url: "https://m.example/v2",
          caps: all,
          skipVerify: false,
          ca: [],
          client: [
            ["/etc/containerd/certs.d/reg.example/c.pem", "/k.pem"],
            ["/etc/containerd/certs.d/reg.example/both.pem", ""],
          ],
          headers: { "x-one": ["1"], "x-many": ["a", "b"] },
        },
        { url: "https://reg.example/v2", caps: all, skipVerify: false, ca: [] },
      ],
    },
    {
      name: "capabilities are case-insensitive; an empty list means the default",
      toml: `[host."http://m.example"]
  capabilities = ["PULL"]
[host."http://n.example"]
  capabilities = []
`,
      want: [
        { url: "http://m.example/v2", caps: ["pull"], skipVerify: false, ca: [] },
        { url: "http://n.example/v2", caps: all, skipVerify: false, ca: [] },
        { url: "https://reg.example/v2", caps: all, skipVerify: false, ca: [] },
      ],
    },
  ];
  for (const t of table) {
    test(t.name, () => {
      const got = parseHostsToml(t.toml, "/etc/containerd/certs.d/reg.example", t.registry ?? "reg.example");
      expect(got.map(brief)).toEqual(t.want);
    });
  }

  const bad: [string, string, string][] = [
    ["not TOML", `[host."x"`, "not valid TOML"],
    ["unknown capability", `[host."http://m"]\ncapabilities = ["pull", "fly"]`, 'unknown capability "fly"'],
    ["capabilities not a list", `capabilities = "pull"`, "capabilities: must be an array"],
    ["skip_verify not a bool", `skip_verify = "yes"`, "skip_verify: must be a boolean"],
    ["ca of the wrong type", `ca = 1`, "ca: must be a string or an array"],
    ["server not a string", `server = 1`, "server: must be a string"],
    ["ftp server", `server = "ftp://x"`, "only http and https"],
    ["host not a table", `host = 1`, "host: must be a table"],
    ["bad client pair", `[host."https://m"]\nclient = [["a"]]`, "[cert, key] pair"],
  ];
  for (const [name, toml, why] of bad) {
    test(`refuses: ${name}`, () => {
      expect(() => parseHostsToml(toml, "/d", "reg.example", "/d/hosts.toml")).toThrow(HostsConfigError);
      expect(() => parseHostsToml(toml, "/d", "reg.example", "/d/hosts.toml")).toThrow(why);
    });
  }

  test("defaultServer", () => {
    expect(`${defaultServer("docker.io").origin}`).toBe("https://registry-1.docker.io");
    expect(`${defaultServer("r.example:5000").origin}${defaultServer("r.example:5000").path}`).toBe("https://r.example:5000/v2");
  });
});

describe("which directory", () => {
  test("candidates: host_port_, then host:port, then _default", () => {
    expect(hostDirCandidates("/h", "r.example:5000")).toEqual(["/h/r.example_5000_", "/h/r.example:5000", "/h/_default"]);
    expect(hostDirCandidates("/h", "docker.io")).toEqual(["/h/docker.io", "/h/_default"]);
  });

  const base = runDir("registry-hosts-unit");
  const fresh = () => mkdtempSync(`${base}/hosts-`);
  const put = (path: string, text: string) => {
    mkdirSync(path.slice(0, path.lastIndexOf("/")), { recursive: true });
    writeFileSync(path, text);
  };

  test("nothing configured: the default server", async () => {
    const dir = fresh();
    const got = await loadEndpoints(files, dir, "r.example");
    expect(got.map((e) => [`${e.origin}${e.path}`, e.mirror, e.source])).toEqual([["https://r.example/v2", false, "default"]]);
    expect(await loadEndpoints(files, `${dir}/missing`, "r.example")).toHaveLength(1);
  });

  test("the registry's own directory wins over _default; _default is used for others", async () => {
    const dir = fresh();
    put(`${dir}/r.example/hosts.toml`, `[host."http://own.example"]\n`);
    put(`${dir}/_default/hosts.toml`, `[host."http://fallback.example"]\n`);
    expect((await loadEndpoints(files, dir, "r.example")).map((e) => e.origin)).toEqual(["http://own.example", "https://r.example"]);
    expect((await loadEndpoints(files, dir, "other.example")).map((e) => e.origin)).toEqual(["http://fallback.example", "https://other.example"]);
  });

  test("a port: host_port_ first, then host:port", async () => {
    const dir = fresh();
    put(`${dir}/r.example:5000/hosts.toml`, `[host."http://colon.example"]\n`);
    expect((await loadEndpoints(files, dir, "r.example:5000")).map((e) => e.origin)).toEqual(["http://colon.example", "https://r.example:5000"]);
    put(`${dir}/r.example_5000_/hosts.toml`, `[host."http://underscore.example"]\n`);
    expect((await loadEndpoints(files, dir, "r.example:5000")).map((e) => e.origin)).toEqual(["http://underscore.example", "https://r.example:5000"]);
  });

  test("a mirror is marked as one (containerd sends it ?ns=); the registry host itself is not", async () => {
    const dir = fresh();
    put(`${dir}/r.example/hosts.toml`, `server = "https://r.example"\n[host."http://m.example"]\n`);
    expect((await loadEndpoints(files, dir, "r.example")).map((e) => e.mirror)).toEqual([true, false]);
    expect((await loadEndpoints(files, dir, "docker.io")).map((e) => e.mirror)).toEqual([true]); // registry-1.docker.io is not "docker.io"
  });

  test("CA files are read (relative to the host directory); a missing one is an error naming it", async () => {
    const dir = fresh();
    put(`${dir}/r.example/ca.pem`, "PEM TEXT");
    put(`${dir}/r.example/hosts.toml`, `[host."https://m.example"]\n  ca = "ca.pem"\n`);
    const [mirror] = await loadEndpoints(files, dir, "r.example");
    expect(mirror?.ca).toEqual(["PEM TEXT"]);
    put(`${dir}/r.example/hosts.toml`, `[host."https://m.example"]\n  ca = ["ca.pem", "gone.pem"]\n`);
    const err = await loadEndpoints(files, dir, "r.example").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(HostsConfigError);
    expect(String(err)).toContain(`${dir}/r.example/gone.pem`);
  });

  test("a directory without hosts.toml: Docker's layout (*.crt CAs, *.cert + *.key clients) for the default server", async () => {
    const dir = fresh();
    put(`${dir}/r.example/b.crt`, "CA-B");
    put(`${dir}/r.example/a.crt`, "CA-A");
    put(`${dir}/r.example/client.cert`, "CERT");
    put(`${dir}/r.example/client.key`, "KEY");
    put(`${dir}/_default/hosts.toml`, `[host."http://never.example"]\n`);
    const got = await loadEndpoints(files, dir, "r.example");
    expect(got.map((e) => ({ origin: e.origin, ca: e.ca, clients: e.clients }))).toEqual([
      { origin: "https://r.example", ca: ["CA-A", "CA-B"], clients: [{ cert: "CERT", key: "KEY" }] },
    ]);
  });

  test("an oversized CA file, a FIFO for a key, an empty host directory: refused naming the file, or chosen as containerd does", async () => {
    const dir = fresh();
    put(`${dir}/r.example/ca.pem`, "x".repeat(maxHostsFileBytes + 1));
    put(`${dir}/r.example/hosts.toml`, `[host."https://m.example"]\n  ca = "ca.pem"\n`);
    const big = await loadEndpoints(files, dir, "r.example").catch((e: unknown) => e);
    expect(big).toBeInstanceOf(HostsConfigError);
    expect(String(big)).toContain(`${dir}/r.example/ca.pem`);
    put(`${dir}/f.example/client.cert`, "CERT");
    Bun.spawnSync(["mkfifo", `${dir}/f.example/client.key`]);
    const fifo = await loadEndpoints(files, dir, "f.example").catch((e: unknown) => e);
    expect(String(fifo)).toContain("FIFO");
    put(`${dir}/_default/hosts.toml`, `[host."http://fallback.example"]\n`);
    Bun.spawnSync(["mkdir", `${dir}/e.example`]);
    expect((await loadEndpoints(files, dir, "e.example")).map((e) => e.origin)).toEqual(["https://e.example"]);
  });

  test("an invalid hosts.toml is an error naming the file", async () => {
    const dir = fresh();
    put(`${dir}/r.example/hosts.toml`, `[host."http://m"]\ncapabilities = ["nope"]\n`);
    const err = await loadEndpoints(files, dir, "r.example").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(HostsConfigError);
    expect(String(err)).toContain(`${dir}/r.example/hosts.toml`);
  });
});
