// client-node's generated API for a test acting as a kubeconfig's user (RBAC and admission tests ask
// for requests the agent itself never makes). The agent's own requests go through src/kube/api.ts.
import { type ApiConstructor, type ApiType, KubeConfig } from "@kubernetes/client-node";

export function clientNodeApi<T extends ApiType>(kubeconfig: string, Api: ApiConstructor<T>): T {
  const kc = new KubeConfig();
  kc.loadFromFile(kubeconfig);
  return kc.makeApiClient(Api);
}
