// A real Kubernetes control plane for e2e tests: etcd + kube-apiserver (+ kube-controller-manager),
// built from upstream by test/cluster/build.sh, listening on 127.0.0.1 only, with its own PKI, ports
// and data directory per cluster so that clusters never collide.
import { appendFileSync, closeSync, mkdirSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { KubeConfig } from "@kubernetes/client-node";
import type { Subprocess } from "bun";
import { atExit } from "./cleanup.ts";
import { alive, freePort, runDir, runOk, waitFor } from "./exec.ts";

export interface Cluster {
  /** https://127.0.0.1:<port> */
  server: string;
  /** etcd's client URL, http://127.0.0.1:<port> (plain HTTP; tests use its JSON gateway, e.g. to compact). */
  etcdEndpoint: string;
  /** CA that signed the apiserver's serving certificate (what clients trust). */
  caFile: string;
  caPem: string;
  /** The apiserver's serving certificate and key (names 127.0.0.1): for a relay that stands in for it. */
  serving: { certFile: string; keyFile: string };
  /** CA the apiserver trusts for client certificates; kube-controller-manager signs CSRs with it. */
  clientCaFile: string;
  clientCaKeyFile: string;
  /** This cluster's own directory: PKI, kubeconfigs, logs, audit log. */
  dir: string;
  /** Audit log (JSON lines, Metadata level, one ResponseComplete event per request; watches also log ResponseStarted). */
  auditLog: string;
  /** Kubeconfig of a client-certificate user in group system:masters. */
  adminKubeconfig: string;
  admin(): KubeConfig;
  /** Issues a client certificate signed by the client CA (CN=user, O=groups) and writes a kubeconfig using it. */
  clientCertUser(user: string, groups?: string[]): Promise<{ kubeconfig: string; certFile: string; keyFile: string }>;
  /** Host PIDs of the running daemons (for their CPU time and memory in benchmarks). */
  pids(): { etcd?: number; apiserver?: number };
  /** Stops and starts kube-apiserver only (same port, same etcd). */
  restartApiServer(): Promise<void>;
  /** Stops kube-apiserver (etcd keeps running); startApiServer brings it back on the same port and waits until it is ready. */
  stopApiServer(): Promise<void>;
  startApiServer(): Promise<void>;
  /** Stops etcd (kube-apiserver keeps running); startEtcd brings it back on the same ports and data dir and waits until it is healthy. */
  stopEtcd(): Promise<void>;
  startEtcd(): Promise<void>;
  /** A second kube-apiserver on the same etcd, on a port of its own, serving the same PKI; stop() ends it (cluster.stop() too). */
  secondApiServer(): Promise<{ server: string; admin(): KubeConfig; stop(): Promise<void> }>;
  /** Stops every process this cluster started, by PID, and deletes etcd's data; logs and PKI stay in dir for post-mortems. */
  stop(): Promise<void>;
}

const buildScript = new URL("../cluster/build.sh", import.meta.url).pathname;
const serviceIp = "10.0.0.1";
const serviceAccountIssuer = "https://kubernetes.default.svc.cluster.local";
const stopGraceMs = 10_000;

let binDir: Promise<string> | undefined;
let prevBinDir: Promise<string> | undefined;
let clusters = 0;

export type ClusterOptions = {
  /** Start kube-controller-manager (default true). */
  controllerManager?: boolean;
  /**
   * More IP addresses the API server's serving certificate names, for clients that reach it through a
   * relay on another address: nodes on the bridge connect to 10.233.0.1 (test/harness/bridge-relay.ts).
   */
  servingIps?: string[];
  /**
   * Runs etcd and kube-apiserver each in a session of its own, whose autogroup (the kernel's unit of fair
   * CPU share, one per session) gets this nice value. The fleet bench puts 50 nodes beside the control
   * plane on 2 cores, and every systemd service is a session: at nice 0 the control plane's share while
   * the agents work is one 51st, and the requests they make wait for it (-20: served first; its CPU
   * still counts against the same cores).
   */
  controlPlaneNice?: number;
  /**
   * An authorization webhook after Node and RBAC, as gardenlet configures Gardener's node-agent authorizer in a
   * shoot's kube-apiserver (botanist DeployKubeAPIServer, kubeapiserver authorization.go): asked only about
   * requests of the group `group`, a failure to answer denies, no decision cached.
   */
  authorizationWebhook?: { name: string; url: string; caPem: string; group: string };
};

/** Starts a control plane and waits until it serves requests (and, with the controller manager, runs controllers). */
export async function startCluster(opts: ClusterOptions = {}): Promise<Cluster> {
  const bin = await binaries();
  const dir = runDir(`cluster-${++clusters}`);
  const { etcdPort, peerPort, apiPort, kcmPort } = await allocatePorts();
  const pki = await createPki(dir, opts.servingIps ?? []);
  const server = `https://127.0.0.1:${apiPort}`;
  const adminKubeconfig = writeKubeconfig(`${dir}/admin.kubeconfig`, server, pki, pki.admin, "admin");
  const kcmKubeconfig = writeKubeconfig(`${dir}/kcm.kubeconfig`, server, pki, pki.kcm, "system:kube-controller-manager");
  const auditLog = `${dir}/audit.log`;
  writeFileSync(`${dir}/audit-policy.yaml`, auditPolicy);

  const etcd = new Daemon("etcd", etcdArgs(bin, dir, etcdPort, peerPort), dir, opts.controlPlaneNice);
  const authorization = opts.authorizationWebhook ? writeAuthorizationConfig(dir, opts.authorizationWebhook) : undefined;
  const apiserver = new Daemon("kube-apiserver", apiserverArgs(bin, dir, pki, etcdPort, apiPort, auditLog, authorization), dir, opts.controlPlaneNice);
  const kcm = new Daemon("kube-controller-manager", kcmArgs(bin, pki, kcmKubeconfig, kcmPort), dir);
  const daemons = opts.controllerManager === false ? [etcd, apiserver] : [etcd, apiserver, kcm];
  const extraApiServers: Daemon[] = [];
  const stop = async () => {
    for (const d of [...daemons].reverse()) await d.stop();
    for (const d of extraApiServers) await d.stop();
    rmSync(`${dir}/etcd`, { recursive: true, force: true }); // 64 MB of preallocated WAL per cluster
  };
  const admin = () => loadKubeconfig(adminKubeconfig);
  const adminTls = { ca: pki.ca.pem, cert: pki.admin.pem, key: readFileSync(pki.admin.key, "utf8") };
  const apiReady = () => httpsOk(`${server}/readyz`, adminTls);

  try {
    // The apiserver retries etcd on its own, so both start at once; kcm's delegated authentication
    // reads a ConfigMap at startup and fails hard if the apiserver is not serving yet.
    etcd.start();
    apiserver.start();
    await etcd.waitReady("/health", () => etcdHealthy(etcdPort), 30_000);
    await apiserver.waitReady("/readyz", apiReady, 60_000);
    if (daemons.includes(kcm)) {
      kcm.start();
      await kcm.waitReady("/healthz", () => httpsOk(`https://127.0.0.1:${kcmPort}/healthz`, { ca: pki.ca.pem }), 30_000);
      // Pods are rejected until the service account controller has created "default"; waiting here
      // also proves that the controllers run, not just kcm's HTTP server.
      const defaultSa = `${server}/api/v1/namespaces/default/serviceaccounts/default`;
      await kcm.waitReady("the default ServiceAccount", () => httpsOk(defaultSa, adminTls), 30_000);
    }
  } catch (err) {
    await stop();
    throw err;
  }

  return {
    server,
    etcdEndpoint: `http://127.0.0.1:${etcdPort}`,
    caFile: pki.ca.cert,
    caPem: pki.ca.pem,
    serving: { certFile: pki.apiserver.cert, keyFile: pki.apiserver.key },
    clientCaFile: pki.clientCa.cert,
    clientCaKeyFile: pki.clientCa.key,
    dir,
    auditLog,
    adminKubeconfig,
    admin,
    clientCertUser: (user, groups = []) => clientCertUser(dir, server, pki, user, groups),
    pids: () => ({ etcd: etcd.pid, apiserver: apiserver.pid }),
    restartApiServer: async () => {
      await apiserver.stop();
      apiserver.start();
      await apiserver.waitReady("/readyz", apiReady, 60_000);
    },
    stopApiServer: () => apiserver.stop(),
    startApiServer: async () => {
      apiserver.start();
      await apiserver.waitReady("/readyz", apiReady, 60_000);
    },
    stopEtcd: () => etcd.stop(),
    startEtcd: async () => {
      etcd.start();
      await etcd.waitReady("/health", () => etcdHealthy(etcdPort), 30_000);
    },
    secondApiServer: async () => {
      const port = await freePort();
      const second = `https://127.0.0.1:${port}`;
      const d = new Daemon(`kube-apiserver-${port}`, apiserverArgs(bin, dir, pki, etcdPort, port, `${dir}/audit-${port}.log`, authorization), dir);
      extraApiServers.push(d);
      d.start();
      await d.waitReady("/readyz", () => httpsOk(`${second}/readyz`, adminTls), 60_000);
      const kubeconfig = writeKubeconfig(`${dir}/admin-${port}.kubeconfig`, second, pki, pki.admin, "admin");
      return { server: second, admin: () => loadKubeconfig(kubeconfig), stop: () => d.stop() };
    },
    stop,
  };
}

/** The cached binaries; build.sh returns at once when they exist (a cold build takes many minutes). */
export function binaries(): Promise<string> {
  binDir ??= build([]);
  return binDir;
}

/** The directory of the older kubelet (test/cluster/k8s-prev), built and cached like binaries() (build.sh --prev). */
export function prevKubeletBinaries(): Promise<string> {
  prevBinDir ??= build(["--prev"]);
  return prevBinDir;
}

/** Runs build.sh with `args`; it prints the cache directory last. */
const build = (args: string[]): Promise<string> => runOk(["bash", buildScript, ...args], { timeoutMs: 60 * 60_000 }).then((out) => out.trim().split("\n").at(-1) ?? "");

/** A free port per listener, all distinct: the kernel may hand out a port it just freed again. */
async function allocatePorts(): Promise<{ etcdPort: number; peerPort: number; apiPort: number; kcmPort: number }> {
  const taken = new Set<number>();
  const next = async (): Promise<number> => {
    for (;;) {
      const port = await freePort();
      if (!taken.has(port)) {
        taken.add(port);
        return port;
      }
    }
  };
  return { etcdPort: await next(), peerPort: await next(), apiPort: await next(), kcmPort: await next() };
}

// ---------------------------------------------------------------- PKI (openssl CLI)

type KeyPair = { cert: string; key: string; pem: string };
type Pki = {
  ca: KeyPair;
  clientCa: KeyPair;
  apiserver: KeyPair;
  kcmServing: KeyPair;
  admin: KeyPair;
  kcm: KeyPair;
  kubeletClient: KeyPair;
  saKey: string;
  saPub: string;
};

let certs = 0;

async function createPki(dir: string, servingIps: string[]): Promise<Pki> {
  const pki = `${dir}/pki`;
  mkdirSync(pki, { recursive: true });
  // Without an explicit config, `req -x509` applies the system openssl.cnf's v3_ca section and
  // every leaf certificate would claim CA:TRUE.
  writeFileSync(opensslCnf(dir), "[req]\ndistinguished_name = dn\n[dn]\n");
  const [ca, clientCa] = await Promise.all([newCa(dir, "ca", "trellis-e2e-ca"), newCa(dir, "client-ca", "trellis-e2e-client-ca")]);
  const sans = ["IP:127.0.0.1", "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc", `IP:${serviceIp}`, ...servingIps.map((ip) => `IP:${ip}`)];
  const [apiserver, kcmServing, admin, kcm, kubeletClient] = await Promise.all([
    issue(dir, ca, "pki/apiserver", subject("kube-apiserver"), serverExts(sans)),
    issue(dir, ca, "pki/kcm-serving", subject("kube-controller-manager"), serverExts(["IP:127.0.0.1", "DNS:localhost"])),
    issue(dir, clientCa, "pki/admin", subject("admin", ["system:masters"]), clientExts),
    issue(dir, clientCa, "pki/kcm", subject("system:kube-controller-manager"), clientExts),
    // kube-apiserver's identity towards kubelets (logs, exec), as kubeadm issues it.
    issue(dir, clientCa, "pki/apiserver-kubelet-client", subject("kube-apiserver-kubelet-client", ["system:masters"]), clientExts),
  ]);
  const saKey = `${pki}/sa.key`;
  const saPub = `${pki}/sa.pub`;
  await runOk(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", saKey]);
  await runOk(["openssl", "pkey", "-in", saKey, "-pubout", "-out", saPub]);
  return { ca, clientCa, apiserver, kcmServing, admin, kcm, kubeletClient, saKey, saPub };
}

const clientExts = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature", "extendedKeyUsage=clientAuth"];

function serverExts(sans: string[]): string[] {
  return ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature", "extendedKeyUsage=serverAuth", `subjectAltName=${sans.join(",")}`];
}

/** An openssl -subj string; Kubernetes reads the user from CN and the groups from the O attributes. */
function subject(cn: string, orgs: string[] = []): string {
  const esc = (v: string) => v.replace(/[\\/+=,]/g, "\\$&");
  return [`/CN=${esc(cn)}`, ...orgs.map((o) => `/O=${esc(o)}`)].join("");
}

const opensslCnf = (dir: string) => `${dir}/pki/openssl.cnf`;

function newCa(dir: string, name: string, cn: string): Promise<KeyPair> {
  return certificate(dir, `pki/${name}`, subject(cn), ["basicConstraints=critical,CA:TRUE", "keyUsage=critical,keyCertSign,cRLSign"], []);
}

function issue(dir: string, ca: KeyPair, name: string, subj: string, exts: string[]): Promise<KeyPair> {
  return certificate(dir, name, subj, exts, ["-CA", ca.cert, "-CAkey", ca.key]);
}

/** A new P-256 key and its certificate at dir/name.{key,crt}: self-signed, or signed by `signer`. */
async function certificate(dir: string, name: string, subj: string, exts: string[], signer: string[]): Promise<KeyPair> {
  const cert = `${dir}/${name}.crt`;
  const key = `${dir}/${name}.key`;
  await runOk([
    "openssl", "req", "-x509", "-config", opensslCnf(dir), "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
    "-noenc", "-days", "30", "-subj", subj, "-keyout", key, "-out", cert, ...signer, ...exts.flatMap((e) => ["-addext", e]),
  ]);
  return { cert, key, pem: readFileSync(cert, "utf8") };
}

async function clientCertUser(dir: string, server: string, pki: Pki, user: string, groups: string[]) {
  mkdirSync(`${dir}/users`, { recursive: true });
  const name = `users/${++certs}-${user.replace(/[^A-Za-z0-9.-]/g, "_")}`;
  const pair = await issue(dir, pki.clientCa, name, subject(user, groups), clientExts);
  const kubeconfig = writeKubeconfig(`${dir}/${name}.kubeconfig`, server, pki, pair, user);
  return { kubeconfig, certFile: pair.cert, keyFile: pair.key };
}

/** A self-contained kubeconfig (certificates embedded), so it still works when copied elsewhere. */
function writeKubeconfig(path: string, server: string, pki: Pki, pair: KeyPair, user: string): string {
  const b64 = (s: string) => Buffer.from(s).toString("base64");
  const config = {
    apiVersion: "v1",
    kind: "Config",
    clusters: [{ name: "trellis-e2e", cluster: { server, "certificate-authority-data": b64(pki.ca.pem) } }],
    users: [{ name: user, user: { "client-certificate-data": b64(pair.pem), "client-key-data": b64(readFileSync(pair.key, "utf8")) } }],
    contexts: [{ name: "trellis-e2e", context: { cluster: "trellis-e2e", user } }],
    "current-context": "trellis-e2e",
  };
  writeFileSync(path, JSON.stringify(config, null, 2), { mode: 0o600 }); // JSON is valid kubeconfig YAML
  return path;
}

function loadKubeconfig(path: string): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromFile(path);
  return kc;
}

// ---------------------------------------------------------------- component flags

const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
# RequestReceived would log every request twice.
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
`;

function etcdArgs(bin: string, dir: string, port: number, peerPort: number): string[] {
  const client = `http://127.0.0.1:${port}`;
  const peer = `http://127.0.0.1:${peerPort}`;
  return [
    `${bin}/etcd`,
    "--name=trellis-e2e",
    `--data-dir=${dir}/etcd`,
    `--listen-client-urls=${client}`,
    `--advertise-client-urls=${client}`,
    `--listen-peer-urls=${peer}`,
    `--initial-advertise-peer-urls=${peer}`,
    `--initial-cluster=trellis-e2e=${peer}`,
    // Throwaway data: fsync only slows the tests down.
    "--unsafe-no-fsync",
  ];
}

/** kube-apiserver's AuthorizationConfiguration (and the webhook's kubeconfig it names): Node, RBAC, then the webhook. */
function writeAuthorizationConfig(dir: string, w: NonNullable<ClusterOptions["authorizationWebhook"]>): string {
  const kubeconfig = `${dir}/authorization-webhook.kubeconfig`;
  writeFileSync(
    kubeconfig,
    JSON.stringify({
      apiVersion: "v1",
      kind: "Config",
      clusters: [{ name: w.name, cluster: { server: w.url, "certificate-authority-data": Buffer.from(w.caPem).toString("base64") } }],
      users: [{ name: w.name, user: {} }],
      contexts: [{ name: w.name, context: { cluster: w.name, user: w.name } }],
      "current-context": w.name,
    }),
    { mode: 0o600 },
  );
  const config = `${dir}/authorization-config.yaml`;
  writeFileSync(
    config,
    JSON.stringify({
      apiVersion: "apiserver.config.k8s.io/v1",
      kind: "AuthorizationConfiguration",
      authorizers: [
        { type: "Node", name: "node" },
        { type: "RBAC", name: "rbac" },
        {
          type: "Webhook",
          name: w.name,
          webhook: {
            timeout: "10s",
            cacheAuthorizedRequests: false,
            cacheUnauthorizedRequests: false,
            failurePolicy: "Deny",
            subjectAccessReviewVersion: "v1",
            matchConditionSubjectAccessReviewVersion: "v1",
            matchConditions: [{ expression: `'${w.group}' in request.groups` }],
            connectionInfo: { type: "KubeConfigFile", kubeConfigFile: kubeconfig },
          },
        },
      ],
    }),
  );
  return config;
}

function apiserverArgs(bin: string, dir: string, pki: Pki, etcdPort: number, port: number, auditLog: string, authorizationConfig?: string): string[] {
  return [
    `${bin}/kube-apiserver`,
    `--etcd-servers=http://127.0.0.1:${etcdPort}`,
    `--secure-port=${port}`,
    "--bind-address=127.0.0.1",
    "--advertise-address=127.0.0.1",
    `--tls-cert-file=${pki.apiserver.cert}`,
    `--tls-private-key-file=${pki.apiserver.key}`,
    `--client-ca-file=${pki.clientCa.cert}`,
    authorizationConfig ? `--authorization-config=${authorizationConfig}` : "--authorization-mode=Node,RBAC",
    "--enable-bootstrap-token-auth",
    `--service-account-key-file=${pki.saPub}`,
    `--service-account-signing-key-file=${pki.saKey}`,
    `--service-account-issuer=${serviceAccountIssuer}`,
    `--kubelet-client-certificate=${pki.kubeletClient.cert}`,
    `--kubelet-client-key=${pki.kubeletClient.key}`,
    // A kubelet's node (test/harness/kubelet.ts) is reached at its address: its name resolves nowhere,
    // and looking it up would send a DNS query off the machine.
    "--kubelet-preferred-address-types=InternalIP",
    "--service-cluster-ip-range=10.0.0.0/24",
    "--allow-privileged",
    // Endpoints may not hold a loopback address, so the reconciler would only fail, every 10 s.
    "--endpoint-reconciler-type=none",
    // A graceful shutdown otherwise waits up to the 60 s request timeout for kcm's watches to end;
    // this way it answers 429 + Retry-After while in-flight requests drain, then closes after 2 s.
    "--shutdown-send-retry-after",
    `--audit-policy-file=${dir}/audit-policy.yaml`,
    `--audit-log-path=${auditLog}`,
  ];
}

function kcmArgs(bin: string, pki: Pki, kubeconfig: string, port: number): string[] {
  return [
    `${bin}/kube-controller-manager`,
    `--kubeconfig=${kubeconfig}`,
    `--authentication-kubeconfig=${kubeconfig}`,
    `--authorization-kubeconfig=${kubeconfig}`,
    `--cluster-signing-cert-file=${pki.clientCa.cert}`,
    `--cluster-signing-key-file=${pki.clientCa.key}`,
    "--controllers=*,bootstrapsigner,tokencleaner",
    "--use-service-account-credentials",
    `--service-account-private-key-file=${pki.saKey}`,
    `--root-ca-file=${pki.ca.cert}`,
    "--leader-elect=false",
    "--bind-address=127.0.0.1",
    `--secure-port=${port}`,
    `--tls-cert-file=${pki.kcmServing.cert}`,
    `--tls-private-key-file=${pki.kcmServing.key}`,
  ];
}

// ---------------------------------------------------------------- readiness probes
// Plain fetch rather than client-node: outside `bun test` client-node's TLS needs the undici shim.

async function etcdHealthy(port: number): Promise<boolean> {
  const res = await fetch(`http://127.0.0.1:${port}/health`);
  return res.ok && ((await res.json()) as { health?: string }).health === "true";
}

async function httpsOk(url: string, tls: { ca: string; cert?: string; key?: string }): Promise<boolean> {
  const res = await fetch(url, { tls, signal: AbortSignal.timeout(5_000) });
  await res.arrayBuffer();
  return res.ok;
}

// ---------------------------------------------------------------- processes

class Daemon {
  private proc: Subprocess | undefined;
  readonly log: string;

  constructor(
    readonly name: string,
    private readonly cmd: string[],
    private readonly dir: string,
    /** The nice value of the daemon's own session's autogroup (ClusterOptions.controlPlaneNice). */
    private readonly nice?: number,
  ) {
    this.log = `${dir}/${name}.log`;
  }

  get pid(): number | undefined {
    return this.exited() ? undefined : this.proc?.pid;
  }

  start(): void {
    const fd = openSync(this.log, "a");
    try {
      writeFileSync(fd, `--- ${new Date().toISOString()} ${this.cmd.join(" ")}\n`);
      // pdeathsig covers a bun killed by SIGKILL, where no exit hook runs; setpriv execs the daemon,
      // so proc.pid is the daemon's own PID.
      // setsid execs too (a spawned child leads no process group), so the PID stays the daemon's.
      const session = this.nice === undefined ? [] : ["setsid"];
      const proc = Bun.spawn(["setpriv", "--pdeathsig", "KILL", "--", ...session, ...this.cmd], {
        stdio: ["ignore", fd, fd],
        // etcd reads ETCD_* variables as flags, and proxy variables have no business here.
        env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: this.dir },
      });
      const forget = atExit(() => alive(proc.pid) && process.kill(proc.pid, "SIGKILL"));
      void proc.exited.then(forget);
      this.proc = proc;
      if (this.nice !== undefined) void this.niceSession(proc.pid, this.nice);
    } finally {
      closeSync(fd);
    }
  }

  /**
   * Sets the nice value of the autogroup of `pid`'s session, once it has its own: written before setsid
   * ran, it would change the autogroup of the session that started it (this test run's). A failure is
   * written to the daemon's log; the daemon runs on at nice 0.
   */
  private async niceSession(pid: number, nice: number): Promise<void> {
    const group = (p: number | "self") => readFileSync(`/proc/${p}/autogroup`, "utf8").split(" ")[0];
    try {
      await waitFor(`${this.name} in a session of its own`, () => group(pid) !== group("self"), 5_000, 5);
      writeFileSync(`/proc/${pid}/autogroup`, String(nice));
    } catch (err) {
      if (alive(pid)) appendFileSync(this.log, `--- could not set the nice value of its session's autogroup to ${nice}: ${String(err)}\n`);
    }
  }

  /** Polls `ready` until it is true; fails early if the process exits, and with the log's tail either way. */
  async waitReady(what: string, ready: () => Promise<boolean>, timeoutMs: number): Promise<void> {
    const check = async () => (this.exited() ? "exited" : (await ready()) && "ready");
    const outcome = await waitFor(`${this.name}: ${what}`, check, timeoutMs, 200).catch((err: unknown) => this.fail(String(err)));
    if (outcome === "exited") this.fail(`${this.name} exited with code ${this.proc?.exitCode ?? this.proc?.signalCode}`);
  }

  /** SIGTERM, then SIGKILL after a grace period; only ever this daemon's own PID. */
  async stop(): Promise<void> {
    const proc = this.proc;
    if (!proc || this.exited()) return;
    proc.kill("SIGTERM");
    const timer = setTimeout(() => proc.kill("SIGKILL"), stopGraceMs);
    await proc.exited;
    clearTimeout(timer);
  }

  private exited(): boolean {
    return this.proc?.exitCode != null || this.proc?.signalCode != null;
  }

  private fail(reason: string): never {
    const lines = readFileSync(this.log, "utf8").trimEnd().split("\n");
    throw new Error(`${reason}\n--- last lines of ${this.log} ---\n${lines.slice(-40).join("\n")}`);
  }
}
