// Bun-only stand-in for @kubernetes/client-node's imports of 'undici' (fetch, Agent, ProxyAgent).
// Bun resolves 'undici' to a built-in whose Agent is inert and whose fetch ignores `dispatcher`, so
// the CA, client certificate/key, skipTLSVerify and tls-server-name of a kubeconfig would be dropped
// silently (oven-sh/bun#38840, kubernetes-client/javascript#2627). Here Agent keeps its options and
// fetch() hands them to Bun's native `tls` fetch option. Under Deno the real undici is used instead.
type Connect = {
  ca?: unknown;
  cert?: unknown;
  key?: unknown;
  pfx?: unknown;
  passphrase?: string;
  rejectUnauthorized?: boolean;
  servername?: string;
};

export class Agent {
  readonly connect: Connect | undefined;
  constructor(opts: { connect?: Connect | ((...a: unknown[]) => unknown) } = {}) {
    if (typeof opts.connect === "function") throw new Error("a custom connect() (SOCKS proxy) is not supported under Bun");
    this.connect = opts.connect;
  }
  close(): Promise<void> {
    return Promise.resolve();
  }
  destroy(): Promise<void> {
    return Promise.resolve();
  }
}

export class ProxyAgent extends Agent {
  readonly proxy: string;
  constructor(opts: { uri: string; requestTls?: Connect }) {
    super(opts.requestTls ? { connect: opts.requestTls } : {});
    this.proxy = opts.uri;
  }
}

type BunTls = { ca?: unknown; cert?: unknown; key?: unknown; passphrase?: string; rejectUnauthorized?: boolean; serverName?: string };

export function fetch(input: string | URL | Request, init: RequestInit & { dispatcher?: unknown } = {}): Promise<Response> {
  const { dispatcher, ...rest } = init;
  const bunInit: RequestInit & { tls?: BunTls; proxy?: string } = rest;
  if (dispatcher instanceof Agent) {
    const c = dispatcher.connect ?? {};
    if (c.pfx !== undefined) throw new Error("PKCS#12 (pfx) client certificates are not supported under Bun");
    bunInit.tls = { ca: c.ca, cert: c.cert, key: c.key, passphrase: c.passphrase, rejectUnauthorized: c.rejectUnauthorized, serverName: c.servername };
    if (dispatcher instanceof ProxyAgent) bunInit.proxy = dispatcher.proxy;
  }
  return globalThis.fetch(input, bunInit);
}

export default { fetch, Agent, ProxyAgent };
