// Pieces of the registry client (src/host/registry/client.ts, errors.ts) that need no registry: the
// WWW-Authenticate parser, the token cache, error explanations and the all-endpoints-failed message.
import { describe, expect, test } from "bun:test";
import { parseChallenge, TokenCache } from "../../src/host/registry/client.ts";
import { EndpointsFailedError, explain, ImageError } from "../../src/host/registry/errors.ts";

describe("parseChallenge", () => {
  const table: [string, ReturnType<typeof parseChallenge>][] = [
    [
      'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/alpine:pull"',
      { scheme: "bearer", params: { realm: "https://auth.docker.io/token", service: "registry.docker.io", scope: "repository:library/alpine:pull" } },
    ],
    // A comma inside quotes belongs to the value (scopes list actions that way).
    ['Bearer realm="https://r/token", scope="repository:a:pull,push"', { scheme: "bearer", params: { realm: "https://r/token", scope: "repository:a:pull,push" } }],
    ['Bearer realm=https://r/token,service=reg', { scheme: "bearer", params: { realm: "https://r/token", service: "reg" } }],
    ['Bearer Realm="x\\"y"', { scheme: "bearer", params: { realm: 'x"y' } }],
    ['Basic realm="Registry Realm"', { scheme: "basic", params: { realm: "Registry Realm" } }],
    ["Negotiate", { scheme: "negotiate", params: {} }],
  ];
  for (const [header, want] of table) test(header, () => expect(parseChallenge(header)).toEqual(want));
});

test("TokenCache: tokens expire a little early", () => {
  const cache = new TokenCache();
  cache.set("k", "t", 60, 1_000_000);
  expect(cache.get("k", 1_000_000 + 49_000)).toBe("t");
  expect(cache.get("k", 1_000_000 + 51_000)).toBeUndefined();
  expect(cache.get("other", 1_000_000)).toBeUndefined();
});

describe("explain", () => {
  const err = (code: string, message = `something ${code}`) => Object.assign(new Error(message), { code });
  const table: [unknown, string][] = [
    [err("ECONNREFUSED", "connect ECONNREFUSED 127.0.0.1:1"), "connection refused: connect ECONNREFUSED 127.0.0.1:1"],
    [err("ENOTFOUND", "getaddrinfo ENOTFOUND registry.example.invalid"), "host name does not resolve: getaddrinfo ENOTFOUND registry.example.invalid"],
    [err("DEPTH_ZERO_SELF_SIGNED_CERT", "self signed certificate"), "TLS certificate not trusted (self-signed) (DEPTH_ZERO_SELF_SIGNED_CERT)"],
    [err("ERR_TLS_CERT_ALTNAME_INVALID", "Hostname/IP does not match"), "TLS certificate does not name this host (ERR_TLS_CERT_ALTNAME_INVALID)"],
    [new Error("plain"), "plain"],
    ["a string", "a string"],
  ];
  for (const [input, want] of table) test(want, () => expect(explain(input)).toBe(want));
});

describe("EndpointsFailedError", () => {
  test("lists every endpoint with its reason, in order", () => {
    const e = new EndpointsFailedError("fetching layer 1 of 1", [
      { endpoint: "http://127.0.0.1:1/v2", reason: "connection refused" },
      { endpoint: "https://r.example/v2", reason: "blob: HTTP 503 unavailable", status: 503 },
    ]);
    expect(e.message).toBe("fetching layer 1 of 1 failed on every endpoint tried (http://127.0.0.1:1/v2: connection refused; https://r.example/v2: blob: HTTP 503 unavailable)");
  });
  test("says 'not found' when every endpoint answered 404", () => {
    const e = new EndpointsFailedError("resolving tag v1", [
      { endpoint: "http://m/v2", reason: "manifest v1: HTTP 404 not found", status: 404 },
      { endpoint: "https://r/v2", reason: "manifest v1: HTTP 404 not found", status: 404 },
    ]);
    expect(e.message).toStartWith("resolving tag v1: not found on every endpoint tried (");
  });
  test("no endpoint with the capability", () => {
    expect(new EndpointsFailedError("resolving tag v1", []).message).toContain("no endpoint is configured for this (check capabilities in hosts.toml)");
  });
});

test("ImageError names image and path and keeps them as fields", () => {
  const e = new ImageError("r.example/app:v1", "/usr/bin/x", "file deleted in layer 2 of 3");
  expect(e.message).toBe("image r.example/app:v1, file /usr/bin/x: file deleted in layer 2 of 3");
  expect([e.image, e.filePathInImage, e.reason, e.name]).toEqual(["r.example/app:v1", "/usr/bin/x", "file deleted in layer 2 of 3", "ImageError"]);
});
