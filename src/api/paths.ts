// gardener-node-agent's paths on the node (pkg/apis/config/nodeagent/v1alpha1), kept so trellis can
// take over a node GNA set up, and GNA's control plane finds what it expects.
export const baseDir = "/var/lib/gardener-node-agent";
export const credentialsDir = `${baseDir}/credentials`;
export const paths = {
  baseDir,
  credentialsDir,
  tempDir: `${baseDir}/tmp`,
  bootstrapToken: `${credentialsDir}/bootstrap-token`,
  token: `${credentialsDir}/token`,
  kubeconfig: `${credentialsDir}/kubeconfig`,
  clusterCa: `${baseDir}/cluster-ca.crt`,
  machineName: `${baseDir}/machine-name`,
  zone: `${baseDir}/zone`,
  lastAppliedOsc: `${baseDir}/last-applied-osc.yaml`,
  binaryDir: "/opt/bin",
} as const;
