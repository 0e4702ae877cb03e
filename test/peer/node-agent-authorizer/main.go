// node-agent-authorizer serves Gardener's node-agent authorizer, the authorization webhook every shoot's
// kube-apiserver asks about each request of a gardener-node-agent (group gardener.cloud:node-agents), at the
// Gardener release go.mod pins: gardener-resource-manager's pkg/resourcemanager/webhook/nodeagentauthorizer,
// behind its own HTTP handler (pkg/webhook/authorizer), as gardener-resource-manager registers it. Nothing of
// the decision is rewritten here; what this file does is give it a client of the cluster under test and serve
// it over TLS.
//
// The one difference to a shoot: the machine namespace is unset, as in gardenadm's setup, so the authorizer
// takes an agent's machine name (its user name's suffix) for its Node's name instead of reading the Machine in
// the seed; everything it allows an agent is then decided from that Node, as in a shoot. Field and label
// selectors are authorized as gardener-resource-manager does by default for Kubernetes ≥ 1.34
// (authorizeWithSelectors).
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gardener/gardener/pkg/resourcemanager/webhook/nodeagentauthorizer"
	authorizerwebhook "github.com/gardener/gardener/pkg/webhook/authorizer"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "node-agent-authorizer:", err)
		os.Exit(1)
	}
}

func run() error {
	// A flag set of its own: controller-runtime registers a global --kubeconfig.
	flags := flag.NewFlagSet("node-agent-authorizer", flag.ExitOnError)
	kubeconfig := flags.String("kubeconfig", "", "`file`: the cluster the authorizer reads Nodes, Pods, Secrets and CSRs from")
	listen := flags.String("listen", "127.0.0.1:0", "`address` to serve on; the one taken is printed on stdout")
	certFile := flags.String("tls-cert-file", "", "`file`: the serving certificate")
	keyFile := flags.String("tls-private-key-file", "", "`file`: its key")
	if err := flags.Parse(os.Args[1:]); err != nil {
		return err
	}
	if *kubeconfig == "" || *certFile == "" || *keyFile == "" {
		return errors.New("--kubeconfig, --tls-cert-file and --tls-private-key-file are required")
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", *kubeconfig, err)
	}
	c, err := client.New(config, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return fmt.Errorf("a client of %s: %w", config.Host, err)
	}
	// Its decisions, one JSON line each on stderr: what a test reads when a request is refused.
	log := funcr.NewJSON(func(obj string) { fmt.Fprintln(os.Stderr, obj) }, funcr.Options{Verbosity: 1})
	authorizer := nodeagentauthorizer.NewAuthorizer(log, c, c, nil, true)
	mux := http.NewServeMux()
	mux.Handle(nodeagentauthorizer.WebhookPath, &authorizerwebhook.Handler{Logger: logr.Logger(log).WithName(nodeagentauthorizer.HandlerName), Authorizer: authorizer})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Printf("serving https://%s%s\n", ln.Addr(), nodeagentauthorizer.WebhookPath)
	return (&http.Server{Handler: mux}).ServeTLS(ln, *certFile, *keyFile)
}
