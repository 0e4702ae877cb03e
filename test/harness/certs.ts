// Client certificates with chosen validity dates, signed by a given CA, made with the openssl CLI:
// `openssl req -x509 -days` cannot start a certificate in the past, `openssl ca -startdate/-enddate`
// can. For certificates near the end of their life (the renewal tests) and expired ones.
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { runOk } from "./exec.ts";

export type IssuedCert = { certFile: string; keyFile: string; certPem: string; keyPem: string };

let issued = 0;

/** openssl's GeneralizedTime for -startdate/-enddate: YYYYMMDDHHMMSSZ. */
const asn1Time = (d: Date) => `${d.toISOString().replace(/[-:T]/g, "").slice(0, 14)}Z`;

/**
 * A P-256 client certificate (CN, one O per group) valid from `notBefore` to `notAfter`, signed by
 * the CA in caCert/caKey, written under `dir`. Without a CA it is self-signed (unit tests).
 */
export async function issueClientCert(opts: {
  dir: string;
  commonName: string;
  organizations?: string[];
  notBefore: Date;
  notAfter: Date;
  ca?: { certFile: string; keyFile: string };
}): Promise<IssuedCert> {
  const { dir, cnf } = signingDir(opts.dir);
  const esc = (v: string) => v.replace(/[\\/+=,]/g, "\\$&");
  const subj = [...(opts.organizations ?? []).map((o) => `/O=${esc(o)}`), `/CN=${esc(opts.commonName)}`].join("");
  const keyFile = `${dir}/client.key`;
  const certFile = `${dir}/client.crt`;
  await runOk(["openssl", "req", "-new", ...cnf, "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-noenc", "-subj", subj, "-keyout", keyFile, "-out", `${dir}/client.csr`]);
  const signer = opts.ca ? ["-cert", opts.ca.certFile, "-keyfile", opts.ca.keyFile] : ["-selfsign", "-keyfile", keyFile];
  await sign(cnf, signer, opts, `${dir}/client.csr`, certFile);
  return { certFile, keyFile, certPem: readFileSync(certFile, "utf8"), keyPem: readFileSync(keyFile, "utf8") };
}

/** Signs a PEM certificate request as a client certificate (its subject kept) with the CA: what a CSR signer does. */
export async function signClientCsr(opts: { dir: string; csrPem: string; notBefore: Date; notAfter: Date; ca: { certFile: string; keyFile: string } }): Promise<string> {
  const { dir, cnf } = signingDir(opts.dir);
  writeFileSync(`${dir}/client.csr`, opts.csrPem);
  await sign(cnf, ["-cert", opts.ca.certFile, "-keyfile", opts.ca.keyFile], opts, `${dir}/client.csr`, `${dir}/client.crt`);
  return readFileSync(`${dir}/client.crt`, "utf8");
}

/** A directory of its own with openssl's CA configuration (a client certificate profile). */
function signingDir(parent: string): { dir: string; cnf: string[] } {
  const dir = `${parent}/certs-${process.pid}-${++issued}`;
  mkdirSync(dir, { recursive: true });
  writeFileSync(`${dir}/index.txt`, "");
  writeFileSync(
    `${dir}/openssl.cnf`,
    `[req]
distinguished_name = dn
[dn]
[ca]
default_ca = ca_default
[ca_default]
database = ${dir}/index.txt
new_certs_dir = ${dir}
serial = ${dir}/serial
default_md = sha256
policy = policy_any
unique_subject = no
[policy_any]
organizationName = optional
commonName = supplied
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
`,
  );
  return { dir, cnf: ["-config", `${dir}/openssl.cnf`] };
}

async function sign(cnf: string[], signer: string[], dates: { notBefore: Date; notAfter: Date }, csrFile: string, certFile: string): Promise<void> {
  await runOk([
    "openssl", "ca", "-batch", ...cnf, "-create_serial", "-notext", "-preserveDN", "-extensions", "client",
    "-startdate", asn1Time(dates.notBefore), "-enddate", asn1Time(dates.notAfter), ...signer, "-in", csrFile, "-out", certFile,
  ]);
}
