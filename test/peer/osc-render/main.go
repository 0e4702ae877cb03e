// osc-render prints the OperatingSystemConfig that gardener-node-agent reads for one worker pool (the
// `osc.yaml` of the Secret kube-system/gardener-node-agent-<pool>-<hash>), rendered by Gardener's own code at
// the version in go.mod. Nothing of Gardener's rendering is rewritten here; what this file does is feed it:
//
//  1. a minimal Shoot built from the inputs and defaulted by Gardener's API defaulting (SetObjectDefaults_Shoot),
//     because the kubelet configuration, SSH access, kube-proxy and the grace periods the components use are
//     the defaulted Shoot's, and the Secret's name hashes them;
//  2. the operatingsystemconfig.Values that gardenlet's botanist derives from that Shoot
//     (OperatingSystemConfigValues, DeployOperatingSystemConfig: a dozen field copies, mirrored below);
//  3. gardenlet's operatingsystemconfig component itself, Deploy()ed against an in-memory fake Seed client and
//     Gardener's fake secrets manager holding the cluster and kubelet CAs. That runs the real deployer: the
//     `original` components (original.Config), the node labels, eviction defaults, criConfig, the Secret's name
//     (Key), and also the `-init` OSC (gardener-node-init) of the same pool;
//  4. nodeagent.OperatingSystemConfigSecret with resolveSecretRefs=true, as the botanist calls it
//     (DeployManagedResourceForGardenerNodeAgent), and the same ManagedResource registry serialisation for the
//     optional Secret manifest.
//
// What a real cluster adds after gardenlet and cannot come from here: the OS extension's status.extensionUnits/
// extensionFiles and the provider extension's webhook mutations. The extension-side inputs taken are
// `registries` (what e.g. the registry-cache extension's webhook writes into criConfig.containerd.registries)
// and `kubeletConfigPatch` (what a provider's webhook does to the kubelet configuration).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/Masterminds/semver/v3"
	"github.com/andybalholm/brotli"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/version"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"
	fakeclient "sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	"github.com/gardener/gardener/imagevector"
	v1beta1helper "github.com/gardener/gardener/pkg/api/core/v1beta1/helper"
	gardencorev1beta1 "github.com/gardener/gardener/pkg/apis/core/v1beta1"
	v1beta1constants "github.com/gardener/gardener/pkg/apis/core/v1beta1/constants"
	extensionsv1alpha1 "github.com/gardener/gardener/pkg/apis/extensions/v1alpha1"
	resourcesv1alpha1 "github.com/gardener/gardener/pkg/apis/resources/v1alpha1"
	"github.com/gardener/gardener/pkg/client/kubernetes"
	"github.com/gardener/gardener/pkg/component/extensions/operatingsystemconfig"
	"github.com/gardener/gardener/pkg/component/extensions/operatingsystemconfig/original"
	"github.com/gardener/gardener/pkg/component/extensions/operatingsystemconfig/original/components"
	"github.com/gardener/gardener/pkg/component/extensions/operatingsystemconfig/original/components/kubelet"
	"github.com/gardener/gardener/pkg/component/extensions/operatingsystemconfig/original/components/nodeagent"
	oscutils "github.com/gardener/gardener/pkg/component/extensions/operatingsystemconfig/utils"
	gardenletfeatures "github.com/gardener/gardener/pkg/gardenlet/features"
	imagevectorutils "github.com/gardener/gardener/pkg/utils/imagevector"
	"github.com/gardener/gardener/pkg/utils/managedresources"
	secretsutils "github.com/gardener/gardener/pkg/utils/secrets"
	fakesecretsmanager "github.com/gardener/gardener/pkg/utils/secrets/manager/fake"
)

// values: what the Shoot, its CloudProfile, the Seed's CA secrets and gardenlet's image vector would supply.
type values struct {
	Pool              string `json:"pool"`
	KubernetesVersion string `json:"kubernetesVersion"`
	// APIServerURL is what nodes use to reach kube-apiserver (gardenlet: https://api.<shoot domain>).
	APIServerURL string `json:"apiServerURL"`
	// CABundle is the cluster CA (Seed secret "ca", bundle.crt): the agent's trust for the API server and a
	// root certificate on the node.
	CABundle string `json:"caBundle"`
	// KubeletCABundle is the CA kubelet trusts for clients (Seed secret "ca-kubelet"); default: CABundle.
	KubeletCABundle  string  `json:"kubeletCABundle,omitempty"`
	RegistryCABundle *string `json:"registryCABundle,omitempty"`
	// Images overrides gardenlet's image vector by image name (hyperkube, pause-container, gardener-node-agent,
	// ...): name -> full reference. Unset names keep Gardener's defaults for this Kubernetes/Gardener version.
	Images map[string]string `json:"images,omitempty"`
	// ClusterDNS: the kube-dns Service IPs (gardenlet: the 10th address of the Shoot's services CIDR).
	ClusterDNS    []string `json:"clusterDNS"`
	ClusterDomain string   `json:"clusterDomain"`
	MaxPods       *int32   `json:"maxPods,omitempty"`
	// Kubelet is the Shoot's spec.kubernetes.kubelet (Gardener's API: evictionHard, kubeReserved, featureGates,
	// ...); maxPods, if set, overrides its maxPods.
	Kubelet *gardencorev1beta1.KubeletConfig `json:"kubelet,omitempty"`
	// Machine type and image name the pool's Secret name hashes; MachineMemory, if set, is the CloudProfile's
	// memory of that type, which selects kubelet's eviction thresholds.
	MachineType   string `json:"machineType"`
	MachineMemory string `json:"machineMemory,omitempty"`
	ImageName     string `json:"imageName"`
	ImageVersion  string `json:"imageVersion"`
	// KubeletDataVolume mounts /var/lib/kubelet from a data volume (Gardener's kubelet data dir is fixed).
	KubeletDataVolume *gardencorev1beta1.DataVolume `json:"kubeletDataVolume,omitempty"`
	// SSHAccess defaults to true as in a Shoot (spec.provider.workersSettings.sshAccess.enabled).
	SSHAccess     bool              `json:"sshAccess"`
	SSHPublicKeys []string          `json:"sshPublicKeys,omitempty"`
	Sysctls       map[string]string `json:"sysctls,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Taints        []corev1.Taint    `json:"taints,omitempty"`
	// LogShipperHost turns on node log shipping as a Seed with logging does (the collector's ingress host).
	LogShipperHost string `json:"logShipperHost,omitempty"`
	// Registries are added to criConfig.containerd.registries, as an extension's webhook would.
	Registries []extensionsv1alpha1.RegistryConfig `json:"registries,omitempty"`
	// KubeletConfigPatch sets KubeletConfiguration fields (JSON names) in the rendered kubelet config file, as
	// a provider extension's webhook mutates it (genericmutator's EnsureKubeletConfiguration), with Gardener's
	// own codec; e.g. {"failCgroupV1": false} for a machine on cgroup v1, which kubelet 1.35 refuses by default.
	KubeletConfigPatch map[string]any `json:"kubeletConfigPatch,omitempty"`
	// UpdateStrategy is the worker pool's (AutoRollingUpdate, AutoInPlaceUpdate, ManualInPlaceUpdate): an
	// in-place pool's OSC carries spec.inPlaceUpdates.
	UpdateStrategy *gardencorev1beta1.MachineUpdateStrategy `json:"updateStrategy,omitempty"`
	// CredentialsRotation is the Shoot's status.credentials.rotation (CA and service-account key rotations),
	// which an in-place pool's OSC carries as spec.inPlaceUpdates.credentialsRotation.
	CredentialsRotation *gardencorev1beta1.ShootCredentialsRotation `json:"credentialsRotation,omitempty"`
}

// invocation is everything the command line says; it survives the re-exec below as JSON.
type invocation struct {
	Values    values `json:"values"`
	Out       string `json:"out"`
	SecretOut string `json:"secretOut"`
	InitOut   string `json:"initOut"`
}

// reexecDir names the temporary directory through which a process passes its invocation to its re-exec.
const reexecDir = "TRELLIS_OSC_RENDER_REEXEC"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "osc-render:", err)
		os.Exit(1)
	}
}

func run() error {
	inv, err := loadInvocation()
	if err != nil {
		return err
	}
	// Gardener takes image overrides only from the file IMAGEVECTOR_OVERWRITE names, read once at process
	// start (package imagevector's init), and the deployer looks hyperkube up there itself. So the images are
	// handed over the way an operator overrides gardenlet's: that variable, with this program started again.
	if len(inv.Values.Images) > 0 && os.Getenv(reexecDir) == "" {
		return reexec(inv)
	}
	return render(inv)
}

func loadInvocation() (*invocation, error) {
	if dir := os.Getenv(reexecDir); dir != "" {
		defer os.RemoveAll(dir)
		raw, err := os.ReadFile(dir + "/invocation.json")
		if err != nil {
			return nil, err
		}
		inv := &invocation{}
		return inv, json.Unmarshal(raw, inv)
	}

	inv := &invocation{Values: values{
		Pool:              "worker",
		KubernetesVersion: "1.35.4",
		ClusterDomain:     gardencorev1beta1.DefaultDomain,
		ClusterDNS:        []string{"100.64.0.10"},
		MachineType:       "local",
		ImageName:         "debian",
		ImageVersion:      "12",
		SSHAccess:         true,
	}}
	v := &inv.Values
	readFile := func(into *string) func(string) error {
		return func(path string) error {
			raw, err := os.ReadFile(path)
			*into = string(raw)
			return err
		}
	}
	fs := flag.NewFlagSet("osc-render", flag.ExitOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: osc-render [flags]   (flags apply in order: a later flag overrides an earlier --values)")
		fs.PrintDefaults()
	}
	fs.Func("values", "YAML or JSON `file` of values (fields: see test/peer/osc-render/README.md)", func(path string) error {
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return yaml.UnmarshalStrict(raw, v)
	})
	fs.StringVar(&v.APIServerURL, "api-server-url", v.APIServerURL, "kube-apiserver URL as nodes reach it")
	fs.Func("ca-file", "PEM `file`: the cluster CA", readFile(&v.CABundle))
	fs.Func("kubelet-ca-file", "PEM `file`: the CA kubelet trusts for clients (default: the cluster CA)", readFile(&v.KubeletCABundle))
	fs.StringVar(&v.KubernetesVersion, "kubernetes-version", v.KubernetesVersion, "kubelet's Kubernetes version")
	fs.StringVar(&v.Pool, "pool", v.Pool, "worker pool name")
	fs.Func("cluster-dns", "comma-separated cluster DNS `addresses` (default 100.64.0.10)", func(s string) error {
		v.ClusterDNS = strings.Split(s, ",")
		return nil
	})
	fs.Func("max-pods", "kubelet maxPods `n` (default: kubelet's, 110)", func(s string) error {
		var n int32
		_, err := fmt.Sscan(s, &n)
		v.MaxPods = &n
		return err
	})
	fs.Func("image", "`name=ref`: override an image of Gardener's image vector (hyperkube, pause-container, gardener-node-agent); repeatable", func(s string) error {
		name, ref, ok := strings.Cut(s, "=")
		if !ok {
			return fmt.Errorf("want name=ref, got %q", s)
		}
		if v.Images == nil {
			v.Images = map[string]string{}
		}
		v.Images[name] = ref
		return nil
	})
	fs.StringVar(&inv.Out, "out", "", "write osc.yaml to `file` (default: stdout)")
	fs.StringVar(&inv.SecretOut, "secret-out", "", "also write the Secret manifest, as gardenlet's ManagedResource carries it, to `file`")
	fs.StringVar(&inv.InitOut, "init-out", "", "also write the pool's provisioning OSC (gardener-node-init, purpose provision) to `file`")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if v.APIServerURL == "" || v.CABundle == "" {
		return nil, fmt.Errorf("apiServerURL (--api-server-url) and caBundle (--ca-file) are required")
	}
	if v.KubeletCABundle == "" {
		v.KubeletCABundle = v.CABundle
	}
	return inv, nil
}

func reexec(inv *invocation) error {
	if os.Getenv(imagevectorutils.OverrideEnv) != "" {
		return fmt.Errorf("images: give them either in the values or in %s, not both", imagevectorutils.OverrideEnv)
	}
	var overwrite imagevectorutils.ImageVector
	for _, name := range slices.Sorted(maps.Keys(inv.Values.Images)) {
		overwrite = append(overwrite, &imagevectorutils.ImageSource{Name: name, Ref: new(inv.Values.Images[name])})
	}
	imagesYAML, err := yaml.Marshal(map[string]any{"images": overwrite})
	if err != nil {
		return err
	}
	invJSON, err := json.Marshal(inv)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "osc-render-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir) // reached only if the exec failed; else the new process removes it
	if err := os.WriteFile(dir+"/images.yaml", imagesYAML, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(dir+"/invocation.json", invJSON, 0o600); err != nil {
		return err
	}
	env := append(os.Environ(), imagevectorutils.OverrideEnv+"="+dir+"/images.yaml", reexecDir+"="+dir)
	return syscall.Exec(exe, os.Args[:1], env)
}

func render(inv *invocation) error {
	in := inv.Values
	// The version Gardener stamps into its binaries names the agent's config file (config-<version>.yaml) and
	// tags the agent's image; only a build with the ldflags of ../osc-render.sh gets it right.
	if want := gardenerModuleVersion(); version.Get().GitVersion != want {
		return fmt.Errorf("built without the Gardener version stamp (have %q, want %q): build with test/peer/osc-render.sh", version.Get().GitVersion, want)
	}
	// gardenlet's feature gates at their defaults (they choose, e.g., which log shipper component exists).
	gardenletfeatures.RegisterFeatureGates()

	kubernetesVersion, err := semver.NewVersion(in.KubernetesVersion)
	if err != nil {
		return fmt.Errorf("kubernetesVersion: %w", err)
	}

	// 1. The Shoot, as a user would write it, defaulted by Gardener's API defaulting.
	worker := gardencorev1beta1.Worker{
		Name:    in.Pool,
		Machine: gardencorev1beta1.Machine{Type: in.MachineType, Image: &gardencorev1beta1.ShootMachineImage{Name: in.ImageName, Version: &in.ImageVersion}},
		CRI:     &gardencorev1beta1.CRI{Name: gardencorev1beta1.CRINameContainerD},
		Minimum: 1, Maximum: 1,
		Labels:         in.Labels,
		Taints:         in.Taints,
		Sysctls:        in.Sysctls,
		UpdateStrategy: in.UpdateStrategy,
	}
	if dv := in.KubeletDataVolume; dv != nil {
		worker.DataVolumes = []gardencorev1beta1.DataVolume{*dv}
		worker.KubeletDataVolumeName = &dv.Name
	}
	kubelet := &gardencorev1beta1.KubeletConfig{}
	if in.Kubelet != nil {
		kubelet = in.Kubelet
	}
	if in.MaxPods != nil {
		kubelet.MaxPods = in.MaxPods
	}
	shoot := &gardencorev1beta1.Shoot{
		ObjectMeta: metav1.ObjectMeta{Name: "trellis", Namespace: "garden-local"},
		Spec: gardencorev1beta1.ShootSpec{
			Kubernetes: gardencorev1beta1.Kubernetes{Version: kubernetesVersion.String(), Kubelet: kubelet},
			Provider: gardencorev1beta1.Provider{
				Type:            "local",
				Workers:         []gardencorev1beta1.Worker{worker},
				WorkersSettings: &gardencorev1beta1.WorkersSettings{SSHAccess: &gardencorev1beta1.SSHAccess{Enabled: in.SSHAccess}},
			},
			Region: "local",
		},
	}
	gardencorev1beta1.SetObjectDefaults_Shoot(shoot)
	spec := shoot.Spec

	// 2. The values gardenlet derives from it (botanist.OperatingSystemConfigValues).
	images, err := imagevectorutils.FindImages(imagevector.Containers(), []string{imagevector.ContainerImageNamePauseContainer, imagevector.ContainerImageNameValitail, imagevector.ContainerImageNameOpentelemetryCollector}, imagevectorutils.RuntimeVersion(kubernetesVersion.String()), imagevectorutils.TargetVersion(kubernetesVersion.String()))
	if err != nil {
		return err
	}
	if images[imagevector.ContainerImageNameGardenerNodeAgent], err = imagevector.Containers().FindImage(imagevector.ContainerImageNameGardenerNodeAgent); err != nil {
		return err
	}
	images[imagevector.ContainerImageNameGardenerNodeAgent].WithOptionalTag(version.Get().GitVersion)
	var machineTypes []gardencorev1beta1.MachineType
	if in.MachineMemory != "" {
		memory, err := resource.ParseQuantity(in.MachineMemory)
		if err != nil {
			return fmt.Errorf("machineMemory: %w", err)
		}
		machineTypes = []gardencorev1beta1.MachineType{{Name: in.MachineType, Memory: memory}}
	}
	namespace := "shoot--local--trellis"
	oscValues := &operatingsystemconfig.Values{
		Namespace:         namespace,
		KubernetesVersion: kubernetesVersion,
		Workers:           spec.Provider.Workers,
		OriginalValues: operatingsystemconfig.OriginalValues{
			ClusterDomain:                           in.ClusterDomain,
			Images:                                  images,
			KubeletConfig:                           spec.Kubernetes.Kubelet,
			KubeProxyEnabled:                        v1beta1helper.KubeProxyEnabled(spec.Kubernetes.KubeProxy),
			MachineTypes:                            machineTypes,
			SSHAccessEnabled:                        v1beta1helper.ShootEnablesSSHAccess(shoot),
			ValitailEnabled:                         in.LogShipperHost != "",
			ValiIngressHostName:                     in.LogShipperHost,
			OpenTelemetryCollectorLogShipperEnabled: in.LogShipperHost != "",
			OpenTelemetryIngressHostName:            in.LogShipperHost,
			NodeLocalDNSEnabled:                     v1beta1helper.IsNodeLocalDNSEnabled(spec.SystemComponents),
			NodeMonitorGracePeriod:                  *spec.Kubernetes.KubeControllerManager.NodeMonitorGracePeriod,
			PrimaryIPFamily:                         spec.Networking.IPFamilies[0],
			KubeProxyConfig:                         spec.Kubernetes.KubeProxy,
			RegistryCABundle:                        in.RegistryCABundle,
		},
		CredentialsRotationStatus: in.CredentialsRotation,
	}

	// 3. gardenlet's component against a fake Seed holding the CA secrets (botanist.DeployOperatingSystemConfig).
	ctx := context.Background()
	seed := fakeclient.NewClientBuilder().WithScheme(kubernetes.SeedScheme).Build()
	for name, bundle := range map[string]string{v1beta1constants.SecretNameCACluster: in.CABundle, v1beta1constants.SecretNameCAKubelet: in.KubeletCABundle} {
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Data: map[string][]byte{secretsutils.DataKeyCertificateBundle: []byte(bundle)}}
		if err := seed.Create(ctx, secret); err != nil {
			return err
		}
	}
	recorder := &componentRecorder{}
	original.ComponentsFn = recorder.components
	osc := operatingsystemconfig.New(logr.Discard(), seed, fakesecretsmanager.New(seed, namespace), oscValues, time.Second, time.Second, time.Second)
	osc.SetAPIServerURL(in.APIServerURL)
	osc.SetCABundle(in.CABundle)
	if oscValues.SSHAccessEnabled {
		osc.SetSSHPublicKeys(in.SSHPublicKeys)
	}
	osc.SetClusterDNSAddresses(in.ClusterDNS)
	if err := osc.Deploy(ctx); err != nil {
		return err
	}
	data := osc.WorkerPoolNameToOperatingSystemConfigsMap()[in.Pool]

	// What an extension's webhook adds (e.g. registry-cache): registry mirrors for containerd.
	reconcile := data.Original.Object.DeepCopy()
	if len(in.Registries) > 0 {
		reconcile.Spec.CRIConfig.Containerd.Registries = in.Registries
	}
	if err := patchKubeletConfig(reconcile.Spec.Files, in.KubeletConfigPatch); err != nil {
		return err
	}

	// 4. The Secret gardener-node-agent watches (botanist.generateOperatingSystemConfigSecretForWorker).
	secret, err := nodeagent.OperatingSystemConfigSecret(ctx, seed, reconcile, data.Original.GardenerNodeAgentSecretName, in.Pool, true)
	if err != nil {
		return err
	}
	oscYAML := secret.Data["osc.yaml"]
	if err := write(inv.Out, oscYAML); err != nil {
		return err
	}
	if inv.SecretOut != "" {
		// The Secret as gardener-resource-manager applies it to the Shoot: the ManagedResource's payload,
		// serialised by Gardener's registry (brotli-compressed, so decompressed here).
		manifests, err := managedresources.NewRegistry(kubernetes.ShootScheme, kubernetes.ShootCodec, kubernetes.ShootSerializer).AddAllAndSerialize(secret)
		if err != nil {
			return err
		}
		manifest, err := io.ReadAll(brotli.NewReader(bytes.NewReader(manifests[resourcesv1alpha1.CompressedDataKey])))
		if err != nil {
			return err
		}
		if err := write(inv.SecretOut, manifest); err != nil {
			return err
		}
	}
	if inv.InitOut != "" {
		initOSC := data.Init.Object.DeepCopy()
		initOSC.ObjectMeta = metav1.ObjectMeta{Name: initOSC.Name}
		initOSC.APIVersion, initOSC.Kind = extensionsv1alpha1.SchemeGroupVersion.String(), extensionsv1alpha1.OperatingSystemConfigResource
		raw, err := yaml.Marshal(initOSC)
		if err != nil {
			return err
		}
		if err := write(inv.InitOut, raw); err != nil {
			return err
		}
	}

	fmt.Fprintf(os.Stderr, "osc-render: Gardener %s, pool %q: Secret kube-system/%s, osc.yaml %d bytes, checksum/data-script %s\n",
		version.Get().GitVersion, in.Pool, secret.Name, len(oscYAML), secret.Annotations["checksum/data-script"])
	fmt.Fprint(os.Stderr, recorder.String())
	return nil
}

// componentRecorder wraps Gardener's own component list (original.ComponentsFn, exposed by Gardener for this)
// to tell which component rendered which units and files.
type componentRecorder struct{ rendered []*recorded }

type recorded struct {
	components.Component
	units, files []string
}

func (r *componentRecorder) components(sshAccessEnabled bool) []components.Component {
	var out []components.Component
	for _, c := range original.Components(sshAccessEnabled) {
		rec := &recorded{Component: c}
		r.rendered = append(r.rendered, rec)
		out = append(out, rec)
	}
	return out
}

func (r *recorded) Config(ctx components.Context) ([]extensionsv1alpha1.Unit, []extensionsv1alpha1.File, error) {
	units, files, err := r.Component.Config(ctx)
	for _, u := range units {
		r.units = append(r.units, u.Name)
	}
	for _, f := range files {
		r.files = append(r.files, f.Path)
	}
	return units, files, err
}

func (r *componentRecorder) String() string {
	var b strings.Builder
	for _, c := range r.rendered {
		fmt.Fprintf(&b, "  component %-24s", c.Name())
		if len(c.units)+len(c.files) == 0 {
			b.WriteString(" (renders nothing with these inputs)")
		}
		if len(c.units) > 0 {
			fmt.Fprintf(&b, " units: %s", strings.Join(c.units, " "))
		}
		if len(c.files) > 0 {
			fmt.Fprintf(&b, " files: %s", strings.Join(c.files, " "))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// patchKubeletConfig applies `patch` to the kubelet config file among `files`, decoding and encoding it with
// Gardener's kubelet config codec as an extension webhook does.
func patchKubeletConfig(files []extensionsv1alpha1.File, patch map[string]any) error {
	if len(patch) == 0 {
		return nil
	}
	codec := kubelet.NewConfigCodec(oscutils.NewFileContentInlineCodec())
	for i := range files {
		if files[i].Path != kubelet.PathKubeletConfig || files[i].Content.Inline == nil {
			continue
		}
		config, err := codec.Decode(files[i].Content.Inline)
		if err != nil {
			return fmt.Errorf("decoding the kubelet config: %w", err)
		}
		doc := map[string]any{}
		raw, err := json.Marshal(config)
		if err == nil {
			err = json.Unmarshal(raw, &doc)
		}
		if err != nil {
			return err
		}
		maps.Copy(doc, patch)
		if raw, err = json.Marshal(doc); err != nil {
			return err
		}
		patched := &kubeletconfigv1beta1.KubeletConfiguration{}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(patched); err != nil {
			return fmt.Errorf("kubeletConfigPatch: %w", err)
		}
		if files[i].Content.Inline, err = codec.Encode(patched, files[i].Content.Inline.Encoding); err != nil {
			return fmt.Errorf("encoding the kubelet config: %w", err)
		}
		return nil
	}
	return fmt.Errorf("kubeletConfigPatch: no file %s in the rendered OSC", kubelet.PathKubeletConfig)
}

func gardenerModuleVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "github.com/gardener/gardener" {
				return dep.Version
			}
		}
	}
	return "unknown"
}

func write(path string, data []byte) error {
	if path == "" || path == "-" {
		_, err := os.Stdout.Write(data)
		return err
	}
	return os.WriteFile(path, data, 0o644)
}
