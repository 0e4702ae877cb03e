// From an OSC to the node's desired state (src/api/desired.ts): what a user sees when the OSC is good,
// and the error lines they get when it is not. Every error names the OSC source and the field.
import { describe, expect, test } from "bun:test";
import {
  type CachedContent,
  type Desired,
  type DesiredUnit,
  defaultFileMode,
  type ImageFileResult,
  imageKey,
  imageRefsOf,
  maxFileBytes,
  parseOsc,
  resolveDesired,
  secretRefsOf,
  sha256Hex,
} from "../../src/api/desired.ts";
import { type OperatingSystemConfig, OperatingSystemConfigSchema } from "../../src/api/osc.ts";
import * as v from "valibot";

const SOURCE = "secret kube-system/gardener-node-agent-worker-1a2b";
const HOST = "node-1";
const HEAD = "apiVersion: extensions.gardener.cloud/v1alpha1\nkind: OperatingSystemConfig\n";

type Secrets = Map<string, Record<string, Uint8Array> | undefined>;
type Doc = { spec?: Record<string, unknown>; status?: Record<string, unknown> };

const bytes = (s: string) => new TextEncoder().encode(s);
const inBytes = (c: Uint8Array | CachedContent | undefined): Uint8Array => {
  if (!(c instanceof Uint8Array)) throw new Error(`expected inline bytes, got ${JSON.stringify(c)}`);
  return c;
};
const text = (c: Uint8Array | CachedContent) => new TextDecoder().decode(inBytes(c));
type Images = Map<string, ImageFileResult>;

/** An OSC document (JSON is YAML) with the right apiVersion and kind. */
const oscText = (doc: Doc) =>
  JSON.stringify({ apiVersion: "extensions.gardener.cloud/v1alpha1", kind: "OperatingSystemConfig", spec: doc.spec ?? {}, ...(doc.status ? { status: doc.status } : {}) });

/** The OSC without the YAML text: for content too large to fit into a document within the parse limits. */
const direct = (doc: Doc) => v.parse(OperatingSystemConfigSchema, JSON.parse(oscText(doc)));

function parsed(doc: Doc): OperatingSystemConfig {
  const r = parseOsc(oscText(doc), SOURCE);
  if (!r.ok) throw new Error(`fixture does not parse:\n${r.errors.join("\n")}`);
  return r.value;
}

const resolve = (doc: Doc, secrets: Secrets = new Map(), hostName = HOST, images: Images = new Map()) =>
  resolveDesired(parsed(doc), { hostName, secrets, images, source: SOURCE });

function ok(doc: Doc, secrets?: Secrets, hostName?: string): Desired {
  const r = resolve(doc, secrets, hostName);
  if (!r.ok) throw new Error(`expected no errors, got:\n${r.errors.join("\n")}`);
  return r.value;
}

function errors(doc: Doc, secrets?: Secrets): string[] {
  const r = resolve(doc, secrets);
  if (r.ok) throw new Error("expected errors, the OSC was accepted");
  for (const e of r.errors) expect(e.startsWith(`${SOURCE}: `)).toBe(true);
  return r.errors;
}

/** The single error of an OSC with exactly one problem. */
function theError(doc: Doc, secrets?: Secrets): string {
  const es = errors(doc, secrets);
  expect(es).toHaveLength(1);
  return es[0] ?? "";
}

const inline = (data: string, encoding?: string) => ({ inline: encoding === undefined ? { data } : { encoding, data } });
const file = (path: string, extra: Record<string, unknown> = {}) => ({ path, content: inline("x"), ...extra });
const unitOf = (d: Desired, name: string): DesiredUnit => {
  const u = d.units.find((x) => x.name === name);
  if (!u) throw new Error(`no unit ${name}`);
  return u;
};
const b64 = (s: string) => Buffer.from(s).toString("base64");

describe("parsing osc.yaml", () => {
  test("a valid Gardener OSC is read, with YAML 1.1 octal permissions and the control plane's fields accepted", () => {
    const r = parseOsc(
      `${HEAD}metadata: {name: osc, namespace: kube-system}
spec:
  type: debian
  purpose: reconcile
  units:
  - name: kubelet.service
    command: restart
    enable: true
    content: |
      [Service]
      ExecStart=/opt/bin/kubelet
    dropIns:
    - {name: 10-env.conf, content: "[Service]\\nEnvironment=A=1\\n"}
    filePaths: [/var/lib/kubelet/config/kubelet]
  - name: containerd.service
  files:
  - path: /var/lib/kubelet/config/kubelet
    permissions: 0644
    content: {inline: {encoding: b64, data: ${b64("kind: KubeletConfiguration\n")}}}
  - path: /etc/sysctl.d/99-k8s.conf
    content: {inline: {data: "net.ipv4.ip_forward = 1"}, transmitUnencoded: true}
  criConfig: {name: containerd, cgroupDriver: systemd}
  class: shoot
  providerConfig: {apiVersion: x/v1, kind: Y}
status:
  extensionUnits: []
  extensionFiles: null
  conditions: [{type: A, status: "True"}]
  lastOperation: {type: Reconcile, state: Succeeded}
  observedGeneration: 3
  cloudConfig: {secretRef: {name: cc, namespace: shoot--a--b}}
`,
      SOURCE,
    );
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.value.spec.units).toHaveLength(2);
    expect(r.value.spec.files?.[0]?.permissions).toBe(0o644);
    const d = resolveDesired(r.value, { hostName: HOST, secrets: new Map(), images: new Map(), source: SOURCE });
    if (!d.ok) throw new Error(d.errors.join("\n"));
    expect(d.value.files.map((f) => [f.path, f.mode, text(f.content)])).toEqual([
      ["/var/lib/kubelet/config/kubelet", 0o644, "kind: KubeletConfiguration\n"],
      ["/etc/sysctl.d/99-k8s.conf", defaultFileMode, "net.ipv4.ip_forward = 1"],
    ]);
    expect(unitOf(d.value, "kubelet.service")).toMatchObject({ command: "restart", enable: true, filePaths: ["/var/lib/kubelet/config/kubelet"] });
    expect(unitOf(d.value, "containerd.service").content).toBeUndefined();
  });

  test.each([
    ["spec", "spec:\n  futureField: {anything: [1, 2]}\n", "spec.futureField"],
    ["a unit", "spec:\n  units: [{name: a.service, contents: x}]\n", "spec.units[0].contents"],
    ["a drop-in", "spec:\n  units: [{name: a.service, dropIns: [{name: a.conf, content: x, mode: 1}]}]\n", "spec.units[0].dropIns[0].mode"],
    ["a file", "spec:\n  files: [{path: /a, owner: root, content: {inline: {data: x}}}]\n", "spec.files[0].owner"],
    ["inline content", "spec:\n  files: [{path: /a, content: {inline: {data: x, compression: gzip}}}]\n", "spec.files[0].content.inline.compression"],
    ["a status unit", "status:\n  extensionUnits: [{name: a.service, restartPolicy: x}]\nspec: {}\n", "status.extensionUnits[0].restartPolicy"],
    ["status", "spec: {}\nstatus:\n  nodeHints: {}\n", "status.nodeHints"],
    ["the top level", "spec: {}\nextra: 1\n", "extra"],
    ["criConfig", "spec:\n  criConfig: {name: containerd, snapshotter: overlayfs}\n", "spec.criConfig.snapshotter"],
    ["a registry of criConfig", "spec:\n  criConfig: {name: containerd, containerd: {registries: [{upstream: a.io, weight: 1}]}}\n", "spec.criConfig.containerd.registries[0].weight"],
  ])("a field Gardener's OSC does not have, in %s, is dropped as gardener-node-agent drops it, and named", (_where, body, field) => {
    const r = parseOsc(`${HEAD}${body}`, SOURCE);
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.ignored).toEqual([`${SOURCE}: ${field}: not a field of Gardener v1.150's OperatingSystemConfig; ignored, as gardener-node-agent ignores it`]);
    expect(JSON.stringify(r.value)).not.toContain(field.split(".").at(-1) as string);
  });

  test("unknown fields are named where they are, each once, what lies below one not looked at; the rest is read", () => {
    const r = parseOsc(
      `${HEAD}x-defaults: &file {permissions: 0644, owner: root}
spec:
  units:
  - {name: a.service, contents: x, dropIns: [{name: a.conf, content: z, mode: 1}]}
  files:
  - <<: *file
    path: /etc/a
    content: {inline: {data: x, compression: {level: 9, deeper: {x: 1}}}}
  - {path: /etc/b, content: {secretRef: {name: s, dataKey: k, namespace: kube-system}}}
  criConfig:
    name: containerd
    containerd:
      plugins: [{path: [a], values: {anything: {goes: here}}, order: 1}]
status:
  providerStatus: {whatever: {the: extension}}
  extensionUnits: [{name: b.service, restartPolicy: always}]
`,
      SOURCE,
    );
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.ignored.map((i) => i.slice(SOURCE.length + 2, i.indexOf(": not a field")))).toEqual([
      "x-defaults",
      "spec.units[0].contents",
      "spec.units[0].dropIns[0].mode",
      "spec.files[0].owner",
      "spec.files[0].content.inline.compression",
      "spec.files[1].content.secretRef.namespace",
      "spec.criConfig.containerd.plugins[0].order",
      "status.extensionUnits[0].restartPolicy",
    ]);
    expect(r.value.spec.files?.[0]).toEqual({ path: "/etc/a", permissions: 0o644, content: { inline: { encoding: "", data: "x" } } });
  });

  test("a key given twice, or replaced by a merge key after it, takes the later value (as Go's decoder does), and is named", () => {
    const r = parseOsc(`${HEAD}base: &b {path: /etc/b}\nspec:\n  files:\n  - path: /etc/a\n    <<: *b\n    content: {inline: {data: first}}\n    content: {inline: {data: second}}\n`, SOURCE);
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.value.spec.files).toEqual([{ path: "/etc/b", content: { inline: { encoding: "", data: "second" } } }]);
    expect(r.ignored).toEqual([
      `${SOURCE}: spec.files[0].path: the value at line 6 is replaced by the merge key (<<) at line 7, as gardener-node-agent's decoder replaces it`,
      `${SOURCE}: spec.files[0].content: the value at line 8 is replaced by the key given again at line 9, as gardener-node-agent's decoder replaces it`,
      `${SOURCE}: base: not a field of Gardener v1.150's OperatingSystemConfig; ignored, as gardener-node-agent ignores it`,
    ]);
  });

  test("YAML that does not parse is one error naming the source", () => {
    const r = parseOsc(`${HEAD}spec:\n  units: [\n`, SOURCE);
    expect(r.ok).toBe(false);
    if (r.ok) return;
    expect(r.errors).toHaveLength(1);
    expect(r.errors[0]).toStartWith(`${SOURCE}: not valid YAML: `);
  });

  test.each([
    ["empty document", "", [""]],
    ["a list instead of an object", "- a\n", [""]],
    // valibot's object schemas let arrays through: `spec: []` read as an OSC without units or files, and
    // applying it removed everything trellis owned.
    ["a list for spec", `${HEAD}spec: []\n`, ["spec"]],
    ["a list for status", `${HEAD}spec: {}\nstatus: []\n`, ["status"]],
    ["a list for criConfig.containerd", `${HEAD}spec:\n  criConfig: {name: containerd, containerd: []}\n`, ["spec.criConfig.containerd"]],
    ["a list for a file's content", `${HEAD}spec:\n  files:\n  - {path: /a, content: []}\n`, ["spec.files[0].content"]],
    ["a list for inline", `${HEAD}spec:\n  files:\n  - {path: /a, content: {inline: [x]}}\n`, ["spec.files[0].content.inline"]],
    ["units not a list", `${HEAD}spec:\n  units: kubelet.service\n`, ["spec.units"]],
    ["files not a list", `${HEAD}spec:\n  files: {path: /a}\n`, ["spec.files"]],
    ["permissions a string", `${HEAD}spec:\n  files:\n  - {path: /a, permissions: "0644", content: {inline: {data: x}}}\n`, ["spec.files[0].permissions"]],
    ["permissions above 07777", `${HEAD}spec:\n  files:\n  - {path: /a, permissions: 0o17777, content: {inline: {data: x}}}\n`, ["spec.files[0].permissions"]],
    ["negative permissions", `${HEAD}spec:\n  files:\n  - {path: /a, permissions: -1, content: {inline: {data: x}}}\n`, ["spec.files[0].permissions"]],
    ["enable the string \"yes\"", `${HEAD}spec:\n  units:\n  - {name: a.service, enable: "yes"}\n`, ["spec.units[0].enable"]],
    ["an unknown command", `${HEAD}spec:\n  units:\n  - {name: a.service, command: reload}\n`, ["spec.units[0].command"]],
    ["a unit without name", `${HEAD}spec:\n  units:\n  - {content: x}\n`, ["spec.units[0].name"]],
    ["a drop-in without content", `${HEAD}spec:\n  units:\n  - {name: a.service, dropIns: [{name: a.conf}]}\n`, ["spec.units[0].dropIns[0].content"]],
    ["filePaths not a list", `${HEAD}spec:\n  units:\n  - {name: a.service, filePaths: /a}\n`, ["spec.units[0].filePaths"]],
    ["a file without content", `${HEAD}spec:\n  files:\n  - {path: /a}\n`, ["spec.files[0].content"]],
    ["inline data a number", `${HEAD}spec:\n  files:\n  - {path: /a, content: {inline: {data: 1}}}\n`, ["spec.files[0].content.inline.data"]],
    ["a status unit with a wrong type", `${HEAD}spec: {}\nstatus:\n  extensionUnits:\n  - {name: a.service, enable: 1}\n`, ["status.extensionUnits[0].enable"]],
    ["no spec", `${HEAD}`, ["spec"]],
    ["wrong apiVersion", `apiVersion: v1\nkind: OperatingSystemConfig\nspec: {}\n`, ["apiVersion"]],
    ["wrong kind", `apiVersion: extensions.gardener.cloud/v1alpha1\nkind: Secret\nspec: {}\n`, ["kind"]],
    [
      "several wrong types at once",
      `${HEAD}spec:\n  units:\n  - {name: a.service, enable: "yes"}\n  files:\n  - {path: /a, permissions: "0644", content: {inline: {data: x}}}\nstatus:\n  extensionUnits:\n  - {name: b.service, enable: "no"}\n`,
      ["spec.units[0].enable", "spec.files[0].permissions", "status.extensionUnits[0].enable"],
    ],
  ])("%s: one error per problem, naming the source and field", (_, yaml, fields) => {
    const r = parseOsc(yaml, SOURCE);
    expect(r.ok).toBe(false);
    if (r.ok) return;
    expect(r.errors).toHaveLength(fields.length);
    fields.forEach((field, i) => expect(r.errors[i]).toStartWith(field ? `${SOURCE}: ${field}: ` : `${SOURCE}: `));
    if (yaml.includes("[]") || yaml.startsWith("- ")) expect(r.errors[0]).toContain("Expected a mapping but received a list");
  });

  test("YAML 1.1 booleans as Go's yaml reads them: enable: yes is true", () => {
    const r = parseOsc(`${HEAD}spec:\n  units:\n  - {name: a.service, enable: no}\n  - {name: b.service, enable: yes}\n`, SOURCE);
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.value.spec.units?.map((u) => u.enable)).toEqual([false, true]);
  });

  test("null lists and fields are the same as absent ones", () => {
    const d = resolveDesired(
      (() => {
        const r = parseOsc(`${HEAD}spec:\n  units:\n  - {name: a.service, command: null, enable: null, content: null, dropIns: null, filePaths: null}\n  files: null\nstatus: null\n`, SOURCE);
        if (!r.ok) throw new Error(r.errors.join("\n"));
        return r.value;
      })(),
      { hostName: HOST, secrets: new Map(), images: new Map(), source: SOURCE },
    );
    if (!d.ok) throw new Error(d.errors.join("\n"));
    expect(d.value.units).toEqual([{ name: "a.service", enable: true, dropIns: [], filePaths: [] }]);
    expect(d.value.files).toEqual([]);
  });

  test("secretRefsOf lists each referenced Secret once, from spec and status", () => {
    const osc = parsed({
      spec: {
        files: [
          { path: "/a", content: { secretRef: { name: "s1", dataKey: "a" } } },
          { path: "/b", content: { secretRef: { name: "s1", dataKey: "b" } } },
          { path: "/c", content: inline("x") },
        ],
      },
      status: { extensionFiles: [{ path: "/d", content: { secretRef: { name: "s2", dataKey: "d" } } }] },
    });
    expect(secretRefsOf(osc, HOST)).toEqual(["s1", "s2"]);
  });

  test("secretRefsOf and imageRefsOf skip files meant for other hosts", () => {
    const osc = parsed({
      spec: {
        files: [
          { path: "/a", hostName: "other", content: { secretRef: { name: "s1", dataKey: "a" } } },
          { path: "/b", hostName: "other", content: { imageRef: { image: "r/i:1", filePathInImage: "/b" } } },
          { path: "/c", content: { imageRef: { image: "r/i:1", filePathInImage: "/c" } } },
          { path: "/d", hostName: HOST, content: { imageRef: { image: "r/i:1", filePathInImage: "/c" } } },
        ],
      },
    });
    expect(secretRefsOf(osc, HOST)).toEqual([]);
    expect(imageRefsOf(osc, HOST)).toEqual([{ image: "r/i:1", filePathInImage: "/c" }]);
  });
});

describe("file content", () => {
  test.each([
    ["no encoding", inline("hello\n"), "hello\n"],
    ['encoding ""', inline("hello\n", ""), "hello\n"],
    ['encoding "plain"', inline("hello\n", "plain"), "hello\n"],
    ['encoding "b64"', inline(b64("hello\n"), "b64"), "hello\n"],
    ['encoding "base64"', inline(b64("hello\n"), "base64"), "hello\n"],
    ["base64 with line breaks inside (as Gardener wraps it)", inline(`${b64("a".repeat(60)).slice(0, 40)}\n${b64("a".repeat(60)).slice(40)}\n`, "b64"), "a".repeat(60)],
    ["base64 of empty content", inline("", "b64"), ""],
    ["base64 with one padding char", inline("YWI=", "b64"), "ab"],
    ["base64 with two padding chars", inline("YQ==", "b64"), "a"],
  ])("%s is decoded", (_, content, expected) => {
    const d = ok({ spec: { files: [{ path: "/etc/x", content }] } });
    expect(d.files).toHaveLength(1);
    expect(text(d.files[0]?.content ?? new Uint8Array())).toBe(expected);
    expect(d.files[0]?.sha256).toBe(sha256Hex(bytes(expected)));
  });

  test("binary base64 content is kept byte for byte", () => {
    const raw = new Uint8Array([0, 1, 2, 254, 255, 10, 13]);
    const d = ok({ spec: { files: [{ path: "/opt/bin/blob", content: inline(Buffer.from(raw).toString("base64"), "b64") }] } });
    expect([...inBytes(d.files[0]?.content)]).toEqual([...raw]);
  });

  test("an unknown encoding is an error naming content.inline.encoding", () => {
    const e = theError({ spec: { files: [{ path: "/etc/x", content: inline("x", "gzip") }] } });
    expect(e).toContain("spec.files[0] (/etc/x).content.inline.encoding");
    expect(e).toContain('unknown encoding "gzip"');
  });

  test.each([
    ["characters outside base64", "aGVsbG8*"],
    ["base64url characters", "a-_b"],
    ["missing padding", "YQ"],
    ["too much padding", "Y==="],
    ["a length that is not a multiple of 4", "YWJjZ"],
    ["padding in the middle", "YQ==YQ=="],
    ["a single character", "a"],
    // Go's StdEncoding skips only line breaks; Buffer.from would skip these and decode the rest.
    ["a space inside", "aGVs bG8="],
    ["a tab inside", "aGVs\tbG8="],
  ])("bad base64 (%s) is an error naming content.inline.data", (_, data) => {
    const e = theError({ spec: { files: [{ path: "/etc/x", content: inline(data, "b64") }] } });
    expect(e).toContain("spec.files[0] (/etc/x).content.inline.data");
    expect(e).toContain("not valid base64");
  });

  test("content from a Secret is used byte for byte", () => {
    const secrets: Secrets = new Map([["creds", { token: bytes("s3cret") }]]);
    const d = ok({ spec: { files: [{ path: "/var/lib/token", permissions: 0o640, content: { secretRef: { name: "creds", dataKey: "token" } } }] } }, secrets);
    expect(d.files.map((f) => [f.path, f.mode, text(f.content)])).toEqual([["/var/lib/token", 0o640, "s3cret"]]);
  });

  test("a missing Secret is an error naming content.secretRef and the Secret", () => {
    const e = theError({ spec: { files: [{ path: "/var/lib/token", content: { secretRef: { name: "creds", dataKey: "token" } } }] } });
    expect(e).toContain("spec.files[0] (/var/lib/token).content.secretRef");
    expect(e).toContain("kube-system/creds not found");
  });

  test("a Secret without the key is an error naming the key", () => {
    const secrets: Secrets = new Map([["creds", { other: bytes("x") }]]);
    const e = theError({ spec: { files: [{ path: "/var/lib/token", content: { secretRef: { name: "creds", dataKey: "token" } } }] } }, secrets);
    expect(e).toContain("spec.files[0] (/var/lib/token).content.secretRef");
    expect(e).toContain('no key "token"');
  });

  test.each(["toString", "constructor", "__proto__", "hasOwnProperty"])("a dataKey %p that the Secret does not have is an error, not a crash", (key) => {
    const secrets: Secrets = new Map([["creds", { token: bytes("x") }]]);
    const e = theError({ spec: { files: [{ path: "/var/lib/token", content: { secretRef: { name: "creds", dataKey: key } } }] } }, secrets);
    expect(e).toContain(`no key "${key}"`);
  });

  const kubeletRef = { image: "registry/hyperkube:v1.35.4", filePathInImage: "/kubelet" };
  const kubeletFile = { path: "/opt/bin/kubelet", permissions: 0o755, content: { imageRef: kubeletRef } };

  test("an imageRef file is copied from the image cache, with its hash and mode", () => {
    const cached = { copyFrom: "/var/lib/gardener-node-agent/trellis/images/blobs/sha256/ab", sha256: "ab".repeat(32) };
    const images: Images = new Map([[imageKey(kubeletRef), { ok: true, content: cached, size: 10 }]]);
    const r = resolve({ spec: { files: [kubeletFile, file("/etc/x")] } }, new Map(), HOST, images);
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.value.files[0]).toEqual({ path: "/opt/bin/kubelet", mode: 0o755, content: cached, sha256: cached.sha256, origin: "spec.files[0] (/opt/bin/kubelet)" });
    expect(r.value.unsupported).toEqual([]);
  });

  // Deliberately unlike gardener-node-agent's first apply, which writes inline files before image files and
  // then takes the path as done (it keeps the inline one until the OSC changes, then writes the image's).
  test("a path given inline and, later, from an image: the image's file is written, the inline entry reported", () => {
    const cached = { copyFrom: "/var/lib/gardener-node-agent/trellis/images/blobs/sha256/ab", sha256: "ab".repeat(32) };
    const images: Images = new Map([[imageKey(kubeletRef), { ok: true, content: cached, size: 10 }]]);
    const osc = parsed({ spec: { files: [{ ...kubeletFile, content: inline("an older kubelet") }] }, status: { extensionFiles: [kubeletFile] } });
    expect(imageRefsOf(osc, HOST)).toEqual([kubeletRef]);
    const r = resolveDesired(osc, { hostName: HOST, secrets: new Map(), images, source: SOURCE });
    if (!r.ok) throw new Error(r.errors.join("\n"));
    expect(r.value.files.map((f) => [f.path, f.content])).toEqual([["/opt/bin/kubelet", cached]]);
    expect(r.value.unsupported).toEqual([expect.stringContaining("spec.files[0] (/opt/bin/kubelet): not written: status.extensionFiles[0] (/opt/bin/kubelet)")]);
  });

  test("an image that could not be fetched is an error naming the file and the image's problem", () => {
    const images: Images = new Map([[imageKey(kubeletRef), { ok: false, error: "registry/hyperkube:v1.35.4: manifest unknown" }]]);
    const r = resolve({ spec: { files: [kubeletFile] } }, new Map(), HOST, images);
    expect(r).toEqual({ ok: false, errors: [`${SOURCE}: spec.files[0] (/opt/bin/kubelet).content.imageRef: registry/hyperkube:v1.35.4: manifest unknown`] });
  });

  test("an image file nobody fetched is an error, never an empty file", () => {
    const e = theError({ spec: { files: [kubeletFile] } });
    expect(e).toContain("content.imageRef");
    expect(e).toContain("was not fetched");
  });

  test.each([
    ["none", {}, "content.inline", "got none"],
    ["inline and secretRef", { ...inline("x"), secretRef: { name: "s", dataKey: "k" } }, "content.inline+secretRef", "got inline, secretRef"],
    ["secretRef and imageRef", { secretRef: { name: "s", dataKey: "k" }, imageRef: { image: "i", filePathInImage: "/f" } }, "content.secretRef+imageRef", "got secretRef, imageRef"],
    ["all three", { ...inline("x"), secretRef: { name: "s", dataKey: "k" }, imageRef: { image: "i", filePathInImage: "/f" } }, "content.inline+secretRef+imageRef", "got inline, secretRef, imageRef"],
    ["nulls only", { inline: null, secretRef: null, imageRef: null }, "content.inline", "got none"],
  ])("content with %s of inline/secretRef/imageRef is an error", (_, content, field, got) => {
    const e = theError({ spec: { files: [{ path: "/etc/x", content }] } });
    expect(e).toContain(`spec.files[0] (/etc/x).${field}`);
    expect(e).toContain("exactly one of inline, secretRef, imageRef");
    expect(e).toContain(got);
  });

  // A document is capped before parsing (src/api/yaml.ts), but aliases can repeat a large scalar.
  const resolveDirect = (doc: Doc) => resolveDesired(direct(doc), { hostName: HOST, secrets: new Map(), images: new Map(), source: SOURCE });

  test("inline content above the size limit is an error", () => {
    const r = resolveDirect({ spec: { files: [{ path: "/etc/big", content: inline("x".repeat(maxFileBytes + 1)) }] } });
    expect(r.ok ? [] : r.errors).toEqual([`${SOURCE}: spec.files[0] (/etc/big).content.inline.data: content is ${maxFileBytes + 1} bytes, more than the limit of ${maxFileBytes}`]);
  });

  test("base64 content whose decoded size is above the limit is an error", () => {
    const r = resolveDirect({ spec: { files: [{ path: "/etc/big", content: inline(Buffer.alloc(maxFileBytes + 1).toString("base64"), "b64") }] } });
    expect(r.ok ? "" : r.errors.join()).toContain("content.inline.data");
  });

  test("content exactly at the size limit is accepted", () => {
    const r = resolveDirect({ spec: { files: [{ path: "/etc/big", content: inline("x".repeat(maxFileBytes)) }] } });
    expect(r.ok && inBytes(r.value.files[0]?.content).byteLength).toBe(maxFileBytes);
  });

  test.each([
    ["unit content", { units: [{ name: "a.service", content: "x".repeat(maxFileBytes + 1) }] }, "unit a.service.content"],
    ["drop-in content", { units: [{ name: "a.service", dropIns: [{ name: "a.conf", content: "x".repeat(maxFileBytes + 1) }] }] }, "unit a.service.dropIns[a.conf].content"],
  ])("%s above the size limit is an error, as for files", (_, spec, field) => {
    const r = resolveDirect({ spec });
    expect(r.ok ? [] : r.errors).toEqual([`${SOURCE}: ${field}: is ${maxFileBytes + 1} bytes, more than the limit of ${maxFileBytes}`]);
  });

  test("Secret content above the size limit is an error naming content.secretRef", () => {
    const secrets: Secrets = new Map([["big", { k: new Uint8Array(maxFileBytes + 1) }]]);
    const e = theError({ spec: { files: [{ path: "/etc/big", content: { secretRef: { name: "big", dataKey: "k" } } }] } }, secrets);
    expect(e).toContain("spec.files[0] (/etc/big).content.secretRef");
  });

  test("permissions default to 0600, given permissions are kept", () => {
    const d = ok({ spec: { files: [file("/a"), file("/b", { permissions: 0o755 }), file("/c", { permissions: 0 }), file("/d", { permissions: 0o4755 })] } });
    expect(d.files.map((f) => [f.path, f.mode])).toEqual([
      ["/a", 0o600],
      ["/b", 0o755],
      ["/c", 0],
      ["/d", 0o4755],
    ]);
  });

  test("each file remembers where in the OSC it came from", () => {
    const d = ok({ spec: { files: [file("/a")] }, status: { extensionFiles: [file("/b")] } });
    expect(d.files.map((f) => f.origin)).toEqual(["spec.files[0] (/a)", "status.extensionFiles[0] (/b)"]);
  });
});

describe("file paths", () => {
  test.each([
    ["a relative path", "etc/x", /not absolute/],
    ["an empty path", "", /not absolute/],
    ["a .. segment", "/etc/../root/.ssh/authorized_keys", /"\.\."/],
    ["a trailing .. segment", "/etc/..", /"\.\."/],
    ["a . segment", "/a/./b", /"\."/],
    ["a double slash", "/a//b", /"?\/\/"?/],
    ["a trailing slash", "/etc/x/", /trailing|ends with/],
    ["a NUL byte", "/etc/x\0y", /NUL/],
    ["a sysctl under /proc", "/proc/sys/kernel/core_pattern", /under \/proc, which belongs to the kernel/],
    ["/proc itself", "/proc", /under \/proc/],
    ["a file under /sys", "/sys/kernel/mm/transparent_hugepage/enabled", /under \/sys/],
    ["a device", "/dev/sda", /under \/dev/],
  ])("%s is an error naming the file and the problem", (_, path, problem) => {
    const e = theError({ spec: { files: [file(path)] } });
    expect(e).toContain(`spec.files[0] (${path}): path `);
    expect(e.slice(e.indexOf("): path ") + 8)).toMatch(problem);
  });

  test("the root directory is not a file path", () => {
    const e = theError({ spec: { files: [file("/")] } });
    expect(e).toContain("spec.files[0] (/): path");
  });

  test.each(["/etc/..x", "/etc/x..", "/etc/.hidden", "/a b/c", "/etc/systemd/system/foo.service.d/extra.conf"])("%p is an acceptable path", (path) => {
    expect(ok({ spec: { files: [file(path)] } }).files.map((f) => f.path)).toEqual([path]);
  });

  // gardener-node-agent writes every entry of a path in turn (spec's, then status's): the last is what the node keeps.
  test("the same path twice in spec.files: the later entry is written, the earlier one reported by both names", () => {
    const d = ok({ spec: { files: [file("/etc/a", { content: inline("first"), permissions: 0o644 }), file("/etc/b"), file("/etc/a", { content: inline("second") })] } });
    expect(d.files.map((f) => [f.path, text(f.content), f.mode, f.origin])).toEqual([
      ["/etc/b", "x", defaultFileMode, "spec.files[1] (/etc/b)"],
      ["/etc/a", "second", defaultFileMode, "spec.files[2] (/etc/a)"],
    ]);
    expect(d.unsupported).toEqual([
      `${SOURCE}: spec.files[0] (/etc/a): not written: spec.files[2] (/etc/a) has the same path and comes later, and the later entry is what the node keeps (gardener-node-agent writes both, in this order)`,
    ]);
  });

  test("the same path in spec.files and status.extensionFiles: status's entry is written, spec's reported, and not even read", () => {
    const d = ok({ spec: { files: [{ path: "/etc/a", content: { secretRef: { name: "missing", dataKey: "k" } } }] }, status: { extensionFiles: [file("/etc/a", { content: inline("status") })] } });
    expect(d.files.map((f) => [f.path, text(f.content)])).toEqual([["/etc/a", "status"]]);
    expect(d.unsupported).toEqual([
      `${SOURCE}: spec.files[0] (/etc/a): not written: status.extensionFiles[0] (/etc/a) has the same path and comes later, and the later entry is what the node keeps (gardener-node-agent writes both, in this order)`,
    ]);
    expect(secretRefsOf(parsed({ spec: { files: [{ path: "/etc/a", content: { secretRef: { name: "s", dataKey: "k" } } }] }, status: { extensionFiles: [file("/etc/a")] } }), HOST)).toEqual([]);
  });

  test("files for another host are dropped, files for this host and for every host are kept", () => {
    const d = ok({
      spec: { files: [file("/etc/everyone"), file("/etc/mine", { hostName: HOST }), file("/etc/theirs", { hostName: "node-2" }), file("/etc/null-host", { hostName: null })] },
    });
    expect(d.files.map((f) => f.path)).toEqual(["/etc/everyone", "/etc/mine", "/etc/null-host"]);
  });

  test("a path repeated for different hosts is not a duplicate: this host's copy wins", () => {
    const d = ok({
      spec: {
        files: [
          { path: "/etc/hostname-conf", hostName: "node-2", content: inline("two") },
          { path: "/etc/hostname-conf", hostName: HOST, content: inline("one") },
        ],
      },
      status: { extensionFiles: [{ path: "/etc/hostname-conf", hostName: "node-3", content: inline("three") }] },
    });
    expect(d.files.map((f) => [f.path, text(f.content)])).toEqual([["/etc/hostname-conf", "one"]]);
  });

  test("a path once for another host and once for every host is not a duplicate here", () => {
    const d = ok({ spec: { files: [{ path: "/etc/c", hostName: "node-2", content: inline("two") }, { path: "/etc/c", content: inline("all") }] } });
    expect(d.files.map((f) => text(f.content))).toEqual(["all"]);
  });

  test("problems in files for other hosts are not this node's problems", () => {
    const d = ok({ spec: { files: [{ path: "relative", hostName: "node-2", content: { secretRef: { name: "missing", dataKey: "k" } } }] } });
    expect(d.files).toEqual([]);
  });

  test("a file at a unit file path is an error", () => {
    const e = theError({ spec: { units: [{ name: "a.service", content: "[Service]\n" }], files: [file("/etc/systemd/system/a.service")] } });
    expect(e).toContain("spec.files[0] (/etc/systemd/system/a.service): path is also written by unit a.service");
  });

  test("a file at a drop-in path is an error", () => {
    const e = theError({
      spec: { units: [{ name: "a.service", dropIns: [{ name: "10-x.conf", content: "" }] }] },
      status: { extensionFiles: [file("/etc/systemd/system/a.service.d/10-x.conf")] },
    });
    expect(e).toContain("status.extensionFiles[0] (/etc/systemd/system/a.service.d/10-x.conf): path is also written by unit a.service.dropIns[10-x.conf]");
  });

  test("a file at the unit path of a unit without content (a host unit) is allowed", () => {
    const d = ok({ spec: { units: [{ name: "a.service" }], files: [file("/etc/systemd/system/a.service")] } });
    expect(d.files.map((f) => f.path)).toEqual(["/etc/systemd/system/a.service"]);
  });
});

describe("units", () => {
  test.each([
    ["a /", "../../etc/passwd.service"],
    ["a / inside", "a/b.service"],
    ["no suffix", "kubelet"],
    ["an unknown suffix", "kubelet.conf"],
    ["an empty name", ""],
    ["only ..", ".."],
    ["only a suffix", ".service"],
    ["a space", "my unit.service"],
    ["a NUL", "a\0.service"],
  ])("a unit name with %s is an error naming the unit", (_, name) => {
    const e = theError({ spec: { units: [{ name }] } });
    expect(e).toContain(`unit ${name}: name must be a systemd unit name`);
  });

  test.each(["kubelet.service", "var-lib.mount", "getty@tty1.service", "a:b_c.timer", "dev-disk-by\\x2dlabel-x.device", "k8s.slice", "x.socket", "y.path", "z.target"])(
    "%p is a valid unit name",
    (name) => {
      expect(ok({ spec: { units: [{ name }] } }).units.map((u) => u.name)).toEqual([name]);
    },
  );

  test("the same unit twice in one list is merged as spec and status are (gardener-node-agent merges one list with itself too), and reported", () => {
    const d = ok({ spec: { units: [{ name: "a.service", enable: false, filePaths: ["/a"] }, { name: "a.service", content: "x", filePaths: ["/b"] }] } });
    expect(d.units).toEqual([{ name: "a.service", content: "x", sha256: sha256Hex("x"), enable: false, dropIns: [], filePaths: ["/a", "/b"] }]);
    expect(d.unsupported).toEqual([
      `${SOURCE}: spec.units[1] (a.service): the unit is in spec.units[0] too: merged into it as gardener-node-agent merges status.extensionUnits into spec.units (the later enable, command and content win; drop-ins and filePaths are added)`,
    ]);
    const status = ok({ spec: { units: [{ name: "a.service" }] }, status: { extensionUnits: [{ name: "a.service" }, { name: "a.service", command: "stop" }] } });
    expect(status.units).toMatchObject([{ name: "a.service", command: "stop" }]);
    expect(status.unsupported).toEqual([expect.stringContaining("status.extensionUnits[1] (a.service): the unit is in status.extensionUnits[0] too")]);
  });

  test("enable defaults to true, command stays unset", () => {
    const d = ok({ spec: { units: [{ name: "a.service" }] } });
    expect(d.units).toEqual([{ name: "a.service", enable: true, dropIns: [], filePaths: [] }]);
  });

  test("a unit's content and drop-ins are hashed", () => {
    const d = ok({ spec: { units: [{ name: "a.service", content: "[Unit]\n", dropIns: [{ name: "10-a.conf", content: "[Service]\n" }] }] } });
    expect(unitOf(d, "a.service")).toMatchObject({ content: "[Unit]\n", sha256: sha256Hex("[Unit]\n"), dropIns: [{ name: "10-a.conf", content: "[Service]\n", sha256: sha256Hex("[Service]\n") }] });
  });

  // gardener-node-agent's mergeUnits (pkg/nodeagent/controller/operatingsystemconfig/changes.go): for the
  // same name, a later entry's non-nil enable/command/content replace the earlier ones; dropIns and
  // filePaths are appended.
  test.each<[string, Record<string, unknown>, Record<string, unknown>, Partial<DesiredUnit>]>([
    ["status enable overrides spec", { enable: true }, { enable: false }, { enable: false }],
    ["status without enable keeps spec's", { enable: false }, {}, { enable: false }],
    ["status null enable keeps spec's", { enable: false }, { enable: null }, { enable: false }],
    ["status command overrides spec", { command: "restart" }, { command: "stop" }, { command: "stop" }],
    ["status without command keeps spec's", { command: "start" }, {}, { command: "start" }],
    ["status content overrides spec", { content: "spec" }, { content: "status" }, { content: "status", sha256: sha256Hex("status") }],
    ["status without content keeps spec's", { content: "spec" }, {}, { content: "spec", sha256: sha256Hex("spec") }],
    ["status gives content to a spec host unit", {}, { content: "status" }, { content: "status" }],
    ["status empty content replaces spec's (empty is content)", { content: "spec" }, { content: "" }, { content: "", sha256: sha256Hex("") }],
    [
      "drop-ins are appended",
      { dropIns: [{ name: "10-a.conf", content: "a" }] },
      { dropIns: [{ name: "20-b.conf", content: "b" }] },
      { dropIns: [{ name: "10-a.conf", content: "a", sha256: sha256Hex("a") }, { name: "20-b.conf", content: "b", sha256: sha256Hex("b") }] },
    ],
    ["filePaths are appended", { filePaths: ["/a", "/b"] }, { filePaths: ["/c"] }, { filePaths: ["/a", "/b", "/c"] }],
    ["filePaths are deduplicated", { filePaths: ["/a", "/b", "/a"] }, { filePaths: ["/b", "/c"] }, { filePaths: ["/a", "/b", "/c"] }],
  ])("spec and status merged by name: %s", (_, spec, status, expected) => {
    const d = ok({ spec: { units: [{ name: "a.service", ...spec }] }, status: { extensionUnits: [{ name: "a.service", ...status }] } });
    expect(d.units).toHaveLength(1);
    expect(unitOf(d, "a.service")).toMatchObject(expected);
  });

  test("merged units keep spec order, status-only units come after", () => {
    const d = ok({ spec: { units: [{ name: "b.service" }, { name: "a.service" }] }, status: { extensionUnits: [{ name: "c.service" }, { name: "a.service", enable: false }] } });
    expect(d.units.map((u) => [u.name, u.enable])).toEqual([
      ["b.service", true],
      ["a.service", false],
      ["c.service", true],
    ]);
  });

  test("the same drop-in name in spec and status: status's is written (gardener-node-agent writes both, in turn), spec's reported", () => {
    const d = ok({
      spec: { units: [{ name: "a.service", dropIns: [{ name: "10-a.conf", content: "a" }, { name: "20-b.conf", content: "b" }] }] },
      status: { extensionUnits: [{ name: "a.service", dropIns: [{ name: "10-a.conf", content: "status" }] }] },
    });
    expect(unitOf(d, "a.service").dropIns.map((x) => [x.name, x.content])).toEqual([
      ["10-a.conf", "status"],
      ["20-b.conf", "b"],
    ]);
    expect(d.unsupported).toEqual([
      `${SOURCE}: unit a.service.dropIns[10-a.conf]: spec.units[0].dropIns[0] is not written: status.extensionUnits[0].dropIns[0] has the same name and comes later, and the later one is what the node keeps (gardener-node-agent writes both, in this order)`,
    ]);
  });

  test("the same drop-in name twice in one unit: the later one is written, the earlier one reported", () => {
    const d = ok({ spec: { units: [{ name: "a.service", dropIns: [{ name: "x.conf", content: "a" }, { name: "x.conf", content: "b" }] }] } });
    expect(unitOf(d, "a.service").dropIns.map((x) => x.content)).toEqual(["b"]);
    expect(d.unsupported).toEqual([expect.stringContaining("unit a.service.dropIns[x.conf]: spec.units[0].dropIns[0] is not written: spec.units[0].dropIns[1]")]);
  });

  test.each([
    ["no .conf suffix", "10-env"],
    ["another suffix", "10-env.service"],
    ["..", "..conf"],
    ["only .conf", ".conf"],
  ])("a drop-in name with %s is written as gardener-node-agent writes it, and reported when systemd does not read it", (_, name) => {
    const d = ok({ spec: { units: [{ name: "a.service", dropIns: [{ name, content: "" }] }] } });
    expect(unitOf(d, "a.service").dropIns.map((x) => x.name)).toEqual([name]);
    expect(d.unsupported).toEqual(
      name.endsWith(".conf") ? [] : [`${SOURCE}: unit a.service.dropIns[${name}]: written as gardener-node-agent writes it, but systemd reads only drop-ins whose name ends in .conf: not acted on by systemd`],
    );
  });

  test.each([
    ["a /", "../../a.service.d/x.conf", "contains /"],
    ["a / inside", "sub/x.conf", "contains /"],
    ["only ..", "..", '"." or ".."'],
    ["only .", ".", '"." or ".."'],
    ["empty", "", "trailing slash"],
    ["a NUL", "x\0.conf", "NUL"],
    ["300 characters", `${"x".repeat(295)}.conf`, "more than Linux's limit of 255"],
  ])("a drop-in name with %s is an error naming the unit and drop-in: it names no file in the unit's .d directory", (_, name, problem) => {
    const e = theError({ spec: { units: [{ name: "a.service", dropIns: [{ name, content: "" }] }] } });
    expect(e).toContain(`unit a.service.dropIns[${name}]: name must be a file name in a.service.d: `);
    expect(e).toContain(problem);
  });

  test.each([
    ["relative", "var/lib/x", /not absolute/],
    ["with ..", "/var/../x", /"\.\."/],
    ["with //", "/var//x", /"?\/\/"?/],
  ])("a %s filePaths entry is an error naming the unit and path", (_, path, problem) => {
    const e = theError({ spec: { units: [{ name: "a.service", filePaths: [path] }] } });
    expect(e).toContain(`unit a.service.filePaths (${path}): path `);
    expect(e.slice(e.indexOf("): path ") + 8)).toMatch(problem);
  });

  test("filePaths may name files that are not in the OSC", () => {
    expect(ok({ spec: { units: [{ name: "a.service", filePaths: ["/not/in/osc"] }] } }).units[0]?.filePaths).toEqual(["/not/in/osc"]);
  });

  test("a NUL byte in unit content is an error", () => {
    expect(theError({ spec: { units: [{ name: "a.service", content: "a\0b" }] } })).toContain("unit a.service.content: contains a NUL byte");
  });

  test("a NUL byte in drop-in content is an error, as in unit content", () => {
    expect(theError({ spec: { units: [{ name: "a.service", dropIns: [{ name: "a.conf", content: "[Service]\0" }] }] } })).toContain(
      "unit a.service.dropIns[a.conf].content: contains a NUL byte",
    );
  });
});

describe("all problems together", () => {
  test("every problem in the OSC is reported, one line each, and nothing is returned to apply", () => {
    const r = resolve({
      spec: {
        units: [
          { name: "kubelet" },
          { name: "a.service", dropIns: [{ name: "../bad", content: "" }], filePaths: ["rel"] },
          { name: "a.service" },
          { name: "b.service", content: "[Unit]\n" },
        ],
        files: [
          file("relative/path"),
          { path: "/etc/enc", content: inline("x", "rot13") },
          { path: "/etc/b64", content: inline("%%%", "b64") },
          { path: "/etc/secret", content: { secretRef: { name: "missing", dataKey: "k" } } },
          { path: "/etc/none", content: {} },
          file("/etc/systemd/system/b.service"),
          file("/etc/fine"),
        ],
      },
    });
    expect(r.ok).toBe(false);
    if (r.ok) return;
    const expected = [
      "spec.files[0] (relative/path): path is not absolute",
      "spec.files[1] (/etc/enc).content.inline.encoding",
      "spec.files[2] (/etc/b64).content.inline.data",
      "spec.files[3] (/etc/secret).content.secretRef",
      "spec.files[4] (/etc/none).content.inline",
      "unit kubelet: name must be",
      "unit a.service.dropIns[../bad]",
      "unit a.service.filePaths (rel)",
      "spec.files[5] (/etc/systemd/system/b.service): path is also written by unit b.service",
    ];
    expect(r.errors).toHaveLength(expected.length);
    for (const part of expected) expect(r.errors.filter((e) => e.includes(part))).toHaveLength(1);
    expect("value" in r).toBe(false);
  });

  test("a file with a bad path and bad content reports both", () => {
    const es = errors({ spec: { files: [{ path: "rel", content: inline("x", "nope") }] } });
    expect(es).toHaveLength(2);
    expect(es.join("\n")).toContain("path is not absolute");
    expect(es.join("\n")).toContain("content.inline.encoding");
  });

  test("one bad file among good ones still means nothing is applied", () => {
    const r = resolve({ spec: { units: [{ name: "a.service", content: "x" }], files: [file("/a"), file("/b"), { path: "/c", content: inline("!", "b64") }] } });
    expect(r.ok).toBe(false);
  });

  test("resolving is deterministic", () => {
    const doc: Doc = { spec: { units: [{ name: "a.service", content: "x", dropIns: [{ name: "a.conf", content: "y" }], filePaths: ["/a"] }], files: [file("/a"), file("/b")] } };
    expect(ok(doc)).toEqual(ok(doc));
  });
});
