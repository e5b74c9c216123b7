package deploycheck_test

// Rendering the Kubernetes manifests (deploy/kubernetes) and decoding them
// strictly into the Kubernetes API types.
//
// The kustomizations are rendered in-process with krusty, the engine
// `kubectl kustomize` runs, pinned by this module's go.mod: no kubectl is
// needed, and every machine renders with the same version.
// TestKubectlKustomizeRendersTheSame renders them again with the kubectl
// an operator would use, when the machine has one, and compares.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// kubeDir holds the kustomizations, relative to the module root.
const kubeDir = "deploy/kubernetes"

// wantTargets must be among the kustomizations found under kubeDir.
var wantTargets = []string{"base", "overlays/production", "overlays/small"}

// kubeTargets lists every folder under kubeDir with a kustomization.yaml,
// relative to kubeDir and sorted: a new overlay is checked without being
// listed here.
func kubeTargets(t *testing.T) []string {
	t.Helper()
	root := filepath.Join(moduleRoot(t), kubeDir)
	var targets []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && d.Name() == "kustomization.yaml" {
			rel, err := filepath.Rel(root, filepath.Dir(path))
			targets = append(targets, filepath.ToSlash(rel))
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(targets)
	for _, w := range wantTargets {
		if !slices.Contains(targets, w) {
			t.Fatalf("%s has no %s/kustomization.yaml (found %v)", kubeDir, w, targets)
		}
	}
	return targets
}

// renderKustomize renders the kustomization in dir as `kubectl kustomize
// dir` does (files outside dir's tree refused, as there).
func renderKustomize(dir string) ([]byte, error) {
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("rendering %s: %w", dir, err)
	}
	return m.AsYaml()
}

// kubeScheme knows exactly the API versions the manifests may use; an
// object of any other (autoscaling/v1, policy/v1beta1, a typo) does not
// decode.
var kubeScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme,
		policyv1.AddToScheme, autoscalingv2.AddToScheme, networkingv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// kubeDecoder decodes YAML strictly, as the API server's strict field
// validation does: an unknown field, a field in the wrong case or a
// duplicate one is an error, not silently dropped.
var kubeDecoder = serializer.NewCodecFactory(kubeScheme, serializer.EnableStrict).UniversalDeserializer()

// kubeObjects are the rendered objects, by kind.
type kubeObjects struct {
	Deployments     []*appsv1.Deployment
	Jobs            []*batchv1.Job
	Services        []*corev1.Service
	PDBs            []*policyv1.PodDisruptionBudget
	HPAs            []*autoscalingv2.HorizontalPodAutoscaler
	NetworkPolicies []*networkingv1.NetworkPolicy
	ConfigMaps      []*corev1.ConfigMap
	Secrets         []*corev1.Secret
	// Other names any other object ("ServiceAccount/x").
	Other []string
	// all is every object in order, for comparisons.
	all []runtime.Object
}

// splitYAML returns the documents of a multi-document YAML stream.
func splitYAML(src []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(src)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) > 0 {
			docs = append(docs, doc)
		}
	}
}

// decodeKube decodes every document of src strictly into its API type.
func decodeKube(src []byte) (*kubeObjects, error) {
	docs, err := splitYAML(src)
	if err != nil {
		return nil, err
	}
	o := &kubeObjects{}
	for i, doc := range docs {
		obj, gvk, err := kubeDecoder.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("object %d: %w", i+1, err)
		}
		o.all = append(o.all, obj)
		switch v := obj.(type) {
		case *appsv1.Deployment:
			o.Deployments = append(o.Deployments, v)
		case *batchv1.Job:
			o.Jobs = append(o.Jobs, v)
		case *corev1.Service:
			o.Services = append(o.Services, v)
		case *policyv1.PodDisruptionBudget:
			o.PDBs = append(o.PDBs, v)
		case *autoscalingv2.HorizontalPodAutoscaler:
			o.HPAs = append(o.HPAs, v)
		case *networkingv1.NetworkPolicy:
			o.NetworkPolicies = append(o.NetworkPolicies, v)
		case *corev1.ConfigMap:
			o.ConfigMaps = append(o.ConfigMaps, v)
		case *corev1.Secret:
			o.Secrets = append(o.Secrets, v)
		default:
			o.Other = append(o.Other, gvk.Kind)
		}
	}
	return o, nil
}

// rendered is one target's rendered YAML, rendered once per test binary.
var rendered = map[string][]byte{}

// renderTarget renders target (relative to kubeDir), or fails t.
func renderTarget(t *testing.T, target string) []byte {
	t.Helper()
	if y, ok := rendered[target]; ok {
		return y
	}
	y, err := renderKustomize(filepath.Join(moduleRoot(t), kubeDir, target))
	if err != nil {
		t.Fatal(err)
	}
	rendered[target] = y
	return y
}

// decodeTarget renders target and decodes it (a fresh copy each call,
// which a test may break).
func decodeTarget(t *testing.T, target string) *kubeObjects {
	t.Helper()
	o, err := decodeKube(renderTarget(t, target))
	if err != nil {
		t.Fatalf("%s: %v", target, err)
	}
	return o
}

func TestKubernetesManifestsDecodeStrictly(t *testing.T) {
	for _, target := range kubeTargets(t) {
		t.Run(target, func(t *testing.T) {
			o := decodeTarget(t, target)
			if len(o.all) < 7 {
				t.Errorf("rendered %d objects, want at least the Deployment, Service, PDB, HPA, Job, NetworkPolicy and ConfigMap", len(o.all))
			}
		})
	}
	// What strictness refuses, on a rendered copy.
	y := string(renderTarget(t, "overlays/production"))
	for _, m := range []struct{ name, old, new, want string }{
		{"unknown field", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: true\n          readOnlyRoot: true", "unknown field"},
		{"field in the wrong case", "readOnlyRootFilesystem: true", "readonlyRootFilesystem: true", "unknown field"},
		{"duplicate field", "revisionHistoryLimit: 5", "revisionHistoryLimit: 5\n  revisionHistoryLimit: 6", "revisionHistoryLimit"},
		{"removed API version", "apiVersion: autoscaling/v2", "apiVersion: autoscaling/v1", "autoscaling/v1"},
		{"unknown kind", "kind: PodDisruptionBudget", "kind: PodDisruptionBudgets", "PodDisruptionBudgets"},
		{"bad quantity", "memory: 1Gi", "memory: 1 GB", "quantities must match"},
	} {
		t.Run(m.name, func(t *testing.T) {
			if !strings.Contains(y, m.old) {
				t.Fatalf("the rendered manifests no longer contain %q: update this mutation", m.old)
			}
			_, err := decodeKube([]byte(strings.Replace(y, m.old, m.new, 1)))
			if err == nil || !strings.Contains(err.Error(), m.want) {
				t.Errorf("decoding with %s: got %v, want an error mentioning %q", m.name, err, m.want)
			}
		})
	}
}

// canonical is objects as sorted JSON lines, for comparing renderings.
func canonical(t *testing.T, objs []runtime.Object) []string {
	t.Helper()
	var out []string
	for _, obj := range objs {
		b, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(b))
	}
	slices.Sort(out)
	return out
}

// TestKubectlKustomizeRendersTheSame: what an operator's `kubectl
// kustomize` (kubectl apply -k) renders is what the checks checked. It
// needs kubectl on PATH (the go-svc machines have it); without one it
// says so and skips.
func TestKubectlKustomizeRendersTheSame(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("no kubectl on PATH: the in-process rendering (krusty) is checked, kubectl's is not")
	}
	ver, _ := exec.Command(kubectl, "version", "--client").Output()
	t.Logf("%s", bytes.TrimSpace(ver))
	for _, target := range kubeTargets(t) {
		t.Run(target, func(t *testing.T) {
			cmd := exec.Command(kubectl, "kustomize", filepath.Join(moduleRoot(t), kubeDir, target))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("kubectl kustomize: %v: %s", err, stderr.String())
			}
			theirs, err := decodeKube(out)
			if err != nil {
				t.Fatalf("kubectl's rendering: %v", err)
			}
			ours := decodeTarget(t, target)
			a, b := canonical(t, ours.all), canonical(t, theirs.all)
			if !slices.Equal(a, b) {
				t.Errorf("kubectl kustomize renders other objects than krusty:\nkrusty:  %s\nkubectl: %s",
					strings.Join(a, "\n         "), strings.Join(b, "\n         "))
			}
		})
	}
}

// readKubeFile reads a file under kubeDir.
func readKubeFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), kubeDir, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
