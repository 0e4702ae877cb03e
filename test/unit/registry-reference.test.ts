// Image reference parsing (src/host/registry/reference.ts): Docker Hub defaults, ports, digests, and what
// is refused — the table follows distribution/reference's ParseNormalizedNamed.
import { describe, expect, test } from "bun:test";
import { formatReference, InvalidReferenceError, parseImageReference } from "../../src/host/registry/reference.ts";
import { normaliseImagePath } from "../../src/host/registry/store.ts";

const d = `sha256:${"a".repeat(64)}`;

describe("parseImageReference", () => {
  const valid: [string, ReturnType<typeof parseImageReference>][] = [
    ["alpine", { registry: "docker.io", repository: "library/alpine", tag: "latest" }],
    ["alpine:3.20", { registry: "docker.io", repository: "library/alpine", tag: "3.20" }],
    ["library/alpine:3", { registry: "docker.io", repository: "library/alpine", tag: "3" }],
    ["bitnami/redis", { registry: "docker.io", repository: "bitnami/redis", tag: "latest" }],
    ["docker.io/alpine", { registry: "docker.io", repository: "library/alpine", tag: "latest" }],
    ["index.docker.io/alpine:1", { registry: "docker.io", repository: "library/alpine", tag: "1" }],
    ["registry.k8s.io/pause:3.10", { registry: "registry.k8s.io", repository: "pause", tag: "3.10" }],
    [
      "europe-docker.pkg.dev/gardener-project/releases/hyperkube:v1.31.1",
      { registry: "europe-docker.pkg.dev", repository: "gardener-project/releases/hyperkube", tag: "v1.31.1" },
    ],
    ["localhost/app", { registry: "localhost", repository: "app", tag: "latest" }],
    ["localhost:5000/app:dev", { registry: "localhost:5000", repository: "app", tag: "dev" }],
    ["127.0.0.1:5000/a/b/c:t", { registry: "127.0.0.1:5000", repository: "a/b/c", tag: "t" }],
    ["[::1]:5000/app", { registry: "[::1]:5000", repository: "app", tag: "latest" }],
    // An uppercase first component is a host for distribution (it cannot be a repository name).
    ["Registry/app", { registry: "Registry", repository: "app", tag: "latest" }],
    [`alpine@${d}`, { registry: "docker.io", repository: "library/alpine", digest: d }],
    // Tag and digest: the digest is what is pulled, the tag is kept as a label.
    [`ghcr.io/o/app:v1@${d}`, { registry: "ghcr.io", repository: "o/app", tag: "v1", digest: d }],
    ["my-reg.example.com:443/team/app_x.y-z:1.0_rc-1", { registry: "my-reg.example.com:443", repository: "team/app_x.y-z", tag: "1.0_rc-1" }],
    ["a/b__c", { registry: "docker.io", repository: "a/b__c", tag: "latest" }],
  ];
  for (const [input, want] of valid) {
    test(`${input}`, () => {
      expect(parseImageReference(input)).toEqual(want);
    });
  }

  const invalid: [string, string][] = [
    ["", "empty"],
    [" alpine", "whitespace"],
    ["Alpine", "lowercase"],
    ["docker.io/Library/alpine", "lowercase"],
    ["alpine:", "malformed tag"],
    ["alpine:-x", "malformed tag"],
    ["alpine:a/b", "malformed registry host"],
    [`alpine@sha256:${"a".repeat(63)}`, "only sha256"],
    [`alpine@sha512:${"a".repeat(128)}`, "only sha256"],
    [`alpine@sha256:${"A".repeat(64)}`, "only sha256"],
    ["alpine@latest", "malformed digest"],
    ["a//b", "malformed repository path component"],
    ["a/-b", "malformed repository path component"],
    ["ghcr.io/", "no repository"],
    ["reg:abc/app", "malformed registry host"],
    [`x/${"a".repeat(260)}`, "longer than 255"],
  ];
  for (const [input, why] of invalid) {
    test(`refuses ${JSON.stringify(input).slice(0, 40)} (${why})`, () => {
      expect(() => parseImageReference(input)).toThrow(InvalidReferenceError);
      expect(() => parseImageReference(input)).toThrow(why);
    });
  }

  test("formatReference gives the fully qualified form", () => {
    expect(formatReference(parseImageReference("alpine"))).toBe("docker.io/library/alpine:latest");
    expect(formatReference(parseImageReference(`ghcr.io/o/app:v1@${d}`))).toBe(`ghcr.io/o/app:v1@${d}`);
  });
});

describe("normaliseImagePath", () => {
  const table: [string, string][] = [
    ["/usr/bin/kubelet", "usr/bin/kubelet"],
    ["usr/bin/kubelet", "usr/bin/kubelet"],
    ["./usr//bin/./kubelet", "usr/bin/kubelet"],
    ["/a/", "a"],
  ];
  for (const [input, want] of table) test(`${input} → ${want}`, () => expect(normaliseImagePath(input)).toBe(want));
  for (const bad of ["/", "", ".", "/a/../b", "..", "a/..", "a\0b"]) {
    test(`refuses ${JSON.stringify(bad)}`, () => expect(() => normaliseImagePath(bad)).toThrow());
  }
});
