package deploycheck_test

// The Kubernetes manifests (deploy/kubernetes): every kustomization is
// rendered, decoded strictly and checked against the product's source
// (kube_source_test.go); TestKubernetesChecksCatchBreakage breaks a
// rendered copy — or the source, or a Secret example — once per check and
// sees that check fail.

import (
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// facts reads the product's facts once, failing t if any is missing.
func facts(t *testing.T, src map[string]string) sourceFacts {
	t.Helper()
	f, problems := loadFacts(src)
	for _, p := range problems {
		t.Error(p)
	}
	return f
}

func sources(t *testing.T) map[string]string {
	t.Helper()
	src, err := readSources(moduleRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// example reads target's secret.example.env.
func example(t *testing.T, target string) (string, secretExample) {
	t.Helper()
	name := filepath.Join(kubeDir, target, secretExampleFile)
	src := readKubeFile(t, filepath.Join(target, secretExampleFile))
	return src, parseSecretExample(name, src)
}

func TestKubernetesSourceFacts(t *testing.T) {
	f := facts(t, sources(t))
	for _, path := range []string{"/health", "/ready"} {
		if !f.rootGETs[path] {
			t.Errorf("server/routes.go: %s is not found as an unconditional root GET route (found %v)", path, f.rootGETs)
		}
	}
	if f.rootGETs["/metrics"] {
		t.Error("server/routes.go: /metrics is registered under a condition, yet read as unconditional")
	}
	for _, key := range []string{"listen", "oauth", "limits"} {
		if _, ok := f.config[key]; !ok {
			t.Errorf("cmd/gpuproxy config: key %q not found (%d keys)", key, len(f.config))
		}
	}
	if f.config["oauth"] == nil || !slices.Contains(slices.Collect(maps.Keys(f.config["oauth"].keys)), "issuer") {
		t.Error("cmd/gpuproxy config: oauth.issuer not found")
	}
	if f.config["limits"] == nil || !f.config["limits"].list {
		t.Error("cmd/gpuproxy config: limits is not read as a list")
	}
	for _, name := range []string{"DATABASE_URL", "GPUPROXY_CONSOLE_SECRET", "GPUPROXY_LISTEN"} {
		if !f.envNames[name] {
			t.Errorf("cmd/gpuproxy envOverrides: %s not found", name)
		}
	}
	t.Logf("image %q (USER %s, ENTRYPOINT %q, EXPOSE %v); /ready waits %s; shutdown %s + flush %s; default listen %s; migrate command %v, lock %v; %d env names",
		f.image, f.imageUser, f.entrypoint, f.exposed, f.readyTimeout, f.shutdownTimeout, f.closeTimeout, f.defaultListen,
		f.migrateCommand, f.migrateLock, len(f.envNames))
}

func TestKubernetesManifests(t *testing.T) {
	f := facts(t, sources(t))
	for _, target := range kubeTargets(t) {
		t.Run(target, func(t *testing.T) {
			_, ex := example(t, target)
			for _, p := range checkKube(decodeTarget(t, target), f, ex) {
				t.Error(p)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// minAvailable makes the budget a minAvailable one.
func minAvailable(o *kubeObjects, v intstr.IntOrString) {
	o.PDBs[0].Spec.MaxUnavailable, o.PDBs[0].Spec.MinAvailable = nil, &v
}

func deploy(o *kubeObjects) *appsv1.Deployment { return o.Deployments[0] }

func serverCtr(o *kubeObjects) *corev1.Container {
	return &o.Deployments[0].Spec.Template.Spec.Containers[0]
}

func jobCtr(o *kubeObjects) *corev1.Container { return &o.Jobs[0].Spec.Template.Spec.Containers[0] }

func hpa(o *kubeObjects) *autoscalingv2.HorizontalPodAutoscaler { return o.HPAs[0] }

func netpol(o *kubeObjects) *networkingv1.NetworkPolicy { return o.NetworkPolicies[0] }

// envVar is the container's variable name, or fails t.
func envVar(t *testing.T, ctr *corev1.Container, name string) *corev1.EnvVar {
	t.Helper()
	for i := range ctr.Env {
		if ctr.Env[i].Name == name {
			return &ctr.Env[i]
		}
	}
	t.Fatalf("container %s sets no %s: update this mutation", ctr.Name, name)
	return nil
}

// dropEnv removes the container's variable name.
func dropEnv(t *testing.T, ctr *corev1.Container, name string) {
	t.Helper()
	envVar(t, ctr, name)
	ctr.Env = slices.DeleteFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == name })
}

// editConfig replaces old by new in every rendered gpuproxy.yaml.
func editConfig(t *testing.T, o *kubeObjects, old, new string) {
	t.Helper()
	changed := false
	for _, cm := range o.ConfigMaps {
		if s, ok := cm.Data["gpuproxy.yaml"]; ok && strings.Contains(s, old) {
			cm.Data["gpuproxy.yaml"] = strings.Replace(s, old, new, 1)
			changed = true
		}
	}
	if !changed {
		t.Fatalf("no rendered gpuproxy.yaml contains %q: update this mutation", old)
	}
}

// egressRule is the NetworkPolicy's egress rule on port, or fails t.
func egressRule(t *testing.T, o *kubeObjects, port int) int {
	t.Helper()
	for i, r := range netpol(o).Spec.Egress {
		for _, p := range r.Ports {
			if p.Port != nil && int(p.Port.IntVal) == port {
				return i
			}
		}
	}
	t.Fatalf("no egress rule on port %d: update this mutation", port)
	return -1
}

// internetRule is the index of the egress rule to 0.0.0.0/0.
func internetRule(t *testing.T, o *kubeObjects) int {
	t.Helper()
	for i, r := range netpol(o).Spec.Egress {
		for _, p := range r.To {
			if p.IPBlock != nil && p.IPBlock.CIDR == "0.0.0.0/0" {
				return i
			}
		}
	}
	t.Fatal("no egress rule to 0.0.0.0/0: update this mutation")
	return -1
}

// kubeMutation breaks one thing: the rendered objects (obj), or a file
// (file, old → new): a product source file relative to the module root,
// or secretExampleFile for the target's example.
type kubeMutation struct {
	name           string
	target         string // default overlays/production
	obj            func(t *testing.T, o *kubeObjects)
	file, old, new string
	want           string
}

func TestKubernetesChecksCatchBreakage(t *testing.T) {
	src := sources(t)
	const prod, small = "overlays/production", "overlays/small"
	for _, m := range []kubeMutation{
		// What is rendered.
		{name: "no PodDisruptionBudget", obj: func(t *testing.T, o *kubeObjects) { o.PDBs = nil }, want: "exactly one PodDisruptionBudget"},
		{name: "no migration Job", obj: func(t *testing.T, o *kubeObjects) { o.Jobs = nil }, want: "exactly one Job"},
		{name: "a Secret rendered", obj: func(t *testing.T, o *kubeObjects) {
			o.Secrets = append(o.Secrets, &corev1.Secret{StringData: map[string]string{"DATABASE_URL": "postgres://x"}})
		}, want: "a Secret"},

		// The image.
		{name: "latest", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).Image = "registry.example.com/gpuproxy:latest" }, want: "never latest"},
		{name: "no tag", obj: func(t *testing.T, o *kubeObjects) { jobCtr(o).Image = "registry.example.com/gpuproxy" }, want: "no tag"},
		{name: "another image", obj: func(t *testing.T, o *kubeObjects) {
			serverCtr(o).Image = "registry.example.com/gpuproxy-dev:0.1.0"
			jobCtr(o).Image = "registry.example.com/gpuproxy-dev:0.1.0"
		}, want: `not the Dockerfile's image "gpuproxy"`},
		{name: "Job on another build", obj: func(t *testing.T, o *kubeObjects) { jobCtr(o).Image = "registry.example.com/gpuproxy:0.0.9" }, want: "same build"},
		{name: "ENTRYPOINT overridden", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).Command = []string{"/bin/sh", "-c"} }, want: "ENTRYPOINT"},
		{name: "image renamed in the Dockerfile", file: dockerfileName, old: "docker build -t gpuproxy ", new: "docker build -t aiserve/proxy ", want: `not the Dockerfile's image "proxy"`},

		// Security.
		{name: "runAsNonRoot off", obj: func(t *testing.T, o *kubeObjects) { deploy(o).Spec.Template.Spec.SecurityContext.RunAsNonRoot = nil }, want: "runAsNonRoot"},
		{name: "runAsNonRoot off in a container", obj: func(t *testing.T, o *kubeObjects) {
			jobCtr(o).SecurityContext.RunAsNonRoot = ptr(false)
		}, want: "container migrate does not set runAsNonRoot"},
		{name: "root", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).SecurityContext.RunAsUser = ptr(int64(0)) }, want: "runs as root"},
		{name: "no runAsUser, named USER", obj: func(t *testing.T, o *kubeObjects) { deploy(o).Spec.Template.Spec.SecurityContext.RunAsUser = nil },
			file: dockerfileName, old: "USER 10001:10001", new: "USER gpuproxy", want: "cannot verify runAsNonRoot"},
		{name: "writable root", obj: func(t *testing.T, o *kubeObjects) { jobCtr(o).SecurityContext.ReadOnlyRootFilesystem = ptr(false) }, want: "readOnlyRootFilesystem"},
		{name: "privilege escalation", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).SecurityContext.AllowPrivilegeEscalation = nil }, want: "allowPrivilegeEscalation"},
		{name: "privileged", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).SecurityContext.Privileged = ptr(true) }, want: "is privileged"},
		{name: "capabilities kept", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).SecurityContext.Capabilities = nil }, want: "drop ALL"},
		{name: "no seccomp", obj: func(t *testing.T, o *kubeObjects) { o.Jobs[0].Spec.Template.Spec.SecurityContext.SeccompProfile = nil }, want: "seccompProfile"},
		{name: "service account token", obj: func(t *testing.T, o *kubeObjects) {
			deploy(o).Spec.Template.Spec.AutomountServiceAccountToken = nil
		}, want: "automountServiceAccountToken"},

		// Resources.
		{name: "no CPU request", obj: func(t *testing.T, o *kubeObjects) { delete(jobCtr(o).Resources.Requests, corev1.ResourceCPU) }, want: "requests no cpu"},
		{name: "no memory request", obj: func(t *testing.T, o *kubeObjects) { delete(serverCtr(o).Resources.Requests, corev1.ResourceMemory) }, want: "requests no memory"},
		{name: "no memory limit", obj: func(t *testing.T, o *kubeObjects) { delete(serverCtr(o).Resources.Limits, corev1.ResourceMemory) }, want: "no memory limit"},
		{name: "limit below request", obj: func(t *testing.T, o *kubeObjects) {
			serverCtr(o).Resources.Limits[corev1.ResourceMemory] = resource.MustParse("64Mi")
		}, want: "below its request"},

		// The address gpuproxy listens on.
		{name: "loopback in gpuproxy.yaml", obj: func(t *testing.T, o *kubeObjects) { editConfig(t, o, "listen: 0.0.0.0:8080", "listen: 127.0.0.1:8080") }, want: "listens on 127.0.0.1:8080 (gpuproxy.yaml)"},
		{name: "no listen: the default", obj: func(t *testing.T, o *kubeObjects) { editConfig(t, o, "listen: 0.0.0.0:8080", "") }, want: "(gpuproxy's default): only inside its pod"},
		{name: "--listen on another port", obj: func(t *testing.T, o *kubeObjects) {
			serverCtr(o).Args = append(serverCtr(o).Args, "--listen", "0.0.0.0:9090")
		}, want: "listens on port 9090 (--listen), the container declares"},
		{name: "GPUPROXY_LISTEN on another port", obj: func(t *testing.T, o *kubeObjects) {
			serverCtr(o).Env = append(serverCtr(o).Env, corev1.EnvVar{Name: "GPUPROXY_LISTEN", Value: ":9090"})
		}, want: "listens on port 9090 (GPUPROXY_LISTEN)"},
		{name: "config not mounted", obj: func(t *testing.T, o *kubeObjects) {
			serverCtr(o).Args = []string{"serve", "-c", "/etc/other/gpuproxy.yaml"}
		}, want: "which no mounted ConfigMap provides"},
		{name: "port not EXPOSEd", file: dockerfileName, old: "EXPOSE 8080", new: "EXPOSE 9090", want: "which the Dockerfile does not EXPOSE"},

		// Probes.
		{name: "readiness on /health", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).ReadinessProbe.HTTPGet.Path = "/health" }, want: `readinessProbe GETs "/health", want "/ready"`},
		{name: "liveness on /ready", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).LivenessProbe.HTTPGet.Path = "/ready" }, want: `livenessProbe GETs "/ready", want "/health"`},
		{name: "startup on a path that is no route", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).StartupProbe.HTTPGet.Path = "/healthz" }, want: `"/healthz", which is not a GET route`},
		{name: "probe on an authenticated route", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).StartupProbe.HTTPGet.Path = "/api/v1/spending" }, want: "not a GET route of the root router"},
		{name: "readiness route renamed in the source", file: "server/routes.go", old: `e.GET("/ready", s.ready, body)`, new: `e.GET("/readyz", s.ready, body)`, want: `"/ready", which is not a GET route`},
		{name: "health route made conditional", file: "server/routes.go", old: "\te.GET(\"/health\", s.health, body)\n",
			new: "\tif s.opts.Health {\n\t\te.GET(\"/health\", s.health, body)\n\t}\n", want: `"/health", which server/routes.go registers only conditionally`},
		{name: "probe on another port", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).LivenessProbe.HTTPGet.Port = intstr.FromInt32(9090) }, want: "livenessProbe probes port 9090"},
		{name: "probe on an unknown port name", obj: func(t *testing.T, o *kubeObjects) {
			serverCtr(o).ReadinessProbe.HTTPGet.Port = intstr.FromString("api")
		}, want: "readinessProbe probes port api (-1)"},
		{name: "container port moved", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).Ports[0].ContainerPort = 9090 }, want: "the container declares"},
		{name: "HTTPS probe", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).ReadinessProbe.HTTPGet.Scheme = corev1.URISchemeHTTPS }, want: "plain HTTP"},
		{name: "no readiness probe", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).ReadinessProbe = nil }, want: "no readinessProbe"},
		{name: "exec probe", obj: func(t *testing.T, o *kubeObjects) {
			serverCtr(o).LivenessProbe.ProbeHandler = corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}
		}, want: "livenessProbe is not an HTTP GET"},
		{name: "readiness timeout at the default", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).ReadinessProbe.TimeoutSeconds = 0 }, want: "readinessProbe timeoutSeconds 0"},
		{name: "/ready waits longer in the source", file: "server/handlers.go", old: "readyTimeout = 3 * time.Second", new: "readyTimeout = 10 * time.Second", want: "/ready's own wait for the database (10s"},

		// gpuproxy.yaml.
		{name: "unknown key", obj: func(t *testing.T, o *kubeObjects) {
			editConfig(t, o, "log_level: info", "log_level: info\nlisten_addr: x")
		}, want: "unknown key listen_addr"},
		{name: "unknown nested key", obj: func(t *testing.T, o *kubeObjects) { editConfig(t, o, "issuer: https", "isuer: https") }, want: "unknown key oauth.isuer"},
		{name: "unknown key in a list", obj: func(t *testing.T, o *kubeObjects) {
			editConfig(t, o, "{window: 60m, limit: 50}", "{window: 60m, max: 50}")
		}, want: "unknown key limits.max"},
		{name: "key renamed in the source", file: "cmd/gpuproxy/config.go", old: "`yaml:\"issuer\"`", new: "`yaml:\"issuer_url\"`", want: "unknown key oauth.issuer"},
		{name: "secret in the ConfigMap", obj: func(t *testing.T, o *kubeObjects) {
			editConfig(t, o, "log_level: info", "log_level: info\nconsole_secret: abc")
		}, want: "gpuproxy.yaml sets console_secret"},
		{name: "database URL in the ConfigMap", obj: func(t *testing.T, o *kubeObjects) {
			editConfig(t, o, "log_level: info", "log_level: info\ndatabase_url: postgres://u:p@db/x")
		}, want: "gpuproxy.yaml sets database_url"},
		{name: "no OAuth issuer", obj: func(t *testing.T, o *kubeObjects) { editConfig(t, o, "issuer: https://gpuproxy.example.com", "") }, want: "oauth.issuer is not set"},
		{name: "http OAuth issuer", obj: func(t *testing.T, o *kubeObjects) {
			editConfig(t, o, "issuer: https://gpuproxy.example.com", "issuer: http://gpuproxy.example.com")
		}, want: "is not an https URL"},

		// Secrets and the environment.
		{name: "misspelt variable", obj: func(t *testing.T, o *kubeObjects) {
			envVar(t, serverCtr(o), "GPUPROXY_CONSOLE_SECRET").Name = "GPUPROXY_CONSOLE_SECRETS"
		},
			want: "GPUPROXY_CONSOLE_SECRETS, which gpuproxy does not read"},
		{name: "variable gone from the source", file: "cmd/gpuproxy/config.go", old: `{"IONET_API_KEY", str(&c.Providers.IONet.APIKey)},`, new: "",
			want: "IONET_API_KEY, which gpuproxy does not read"},
		{name: "secret inline", obj: func(t *testing.T, o *kubeObjects) {
			*envVar(t, serverCtr(o), "VASTAI_API_KEY") = corev1.EnvVar{Name: "VASTAI_API_KEY", Value: "abc"}
		}, want: "sets VASTAI_API_KEY inline"},
		{name: "another Secret", obj: func(t *testing.T, o *kubeObjects) {
			envVar(t, serverCtr(o), "IONET_API_KEY").ValueFrom.SecretKeyRef.Name = "gpuproxy-secrets"
		}, want: `IONET_API_KEY from the Secret "gpuproxy-secrets"`},
		{name: "no console secret", obj: func(t *testing.T, o *kubeObjects) { dropEnv(t, serverCtr(o), "GPUPROXY_CONSOLE_SECRET") },
			file: secretExampleFile, old: "GPUPROXY_CONSOLE_SECRET=\n", new: "", want: "does not set GPUPROXY_CONSOLE_SECRET from the Secret"},
		{name: "optional console secret", obj: func(t *testing.T, o *kubeObjects) {
			envVar(t, serverCtr(o), "GPUPROXY_CONSOLE_SECRET").ValueFrom.SecretKeyRef.Optional = ptr(true)
		}, want: "takes GPUPROXY_CONSOLE_SECRET from the Secret as optional"},
		{name: "no database URL on the replicas", obj: func(t *testing.T, o *kubeObjects) { dropEnv(t, serverCtr(o), "DATABASE_URL") }, want: "SQLite file of its own"},
		{name: "no database URL on the Job", obj: func(t *testing.T, o *kubeObjects) { dropEnv(t, jobCtr(o), "DATABASE_URL") }, want: "the migration Job does not set DATABASE_URL"},
		{name: "Job on another database", obj: func(t *testing.T, o *kubeObjects) {
			envVar(t, jobCtr(o), "DATABASE_URL").ValueFrom.SecretKeyRef.Key = "MIGRATE_DATABASE_URL"
		}, file: secretExampleFile, old: "DATABASE_URL=\n", new: "DATABASE_URL=\n\n# migrations\nMIGRATE_DATABASE_URL=\n", want: "is not the replicas'"},
		{name: "Job reads another configuration", obj: func(t *testing.T, o *kubeObjects) {
			cm := o.ConfigMaps[0].DeepCopy()
			cm.Name = "gpuproxy-migrate-config"
			cm.Data["gpuproxy.yaml"] += "\nlog_level: debug\n"
			o.ConfigMaps = append(o.ConfigMaps, cm)
			o.Jobs[0].Spec.Template.Spec.Volumes[0].ConfigMap.Name = cm.Name
		}, want: "reads another gpuproxy.yaml"},
		{name: "key missing from the example", target: small, obj: func(t *testing.T, o *kubeObjects) {
			serverCtr(o).Env = append(serverCtr(o).Env, corev1.EnvVar{Name: "GPUPROXY_METRICS_TOKEN", ValueFrom: &corev1.EnvVarSource{
				SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: kubeSecretName}, Key: "GPUPROXY_METRICS_TOKEN"}}})
		}, want: "GPUPROXY_METRICS_TOKEN is referenced but deploy/kubernetes/overlays/small/secret.example.env does not list it"},
		{name: "example lacks a key", file: secretExampleFile, old: "\nIONET_API_KEY=\n", new: "\n", want: "IONET_API_KEY is referenced but"},
		{name: "example lists a stale key", file: secretExampleFile, old: "\nIONET_API_KEY=\n", new: "\nIONET_API_KEY=\n\n# gone\nGPUPROXY_OLD=\n", want: "GPUPROXY_OLD, which nothing references"},
		{name: "example key without a comment", file: secretExampleFile, old: "\nIONET_API_KEY=\n", new: "\n\nIONET_API_KEY=\n", want: "IONET_API_KEY without a comment"},
		{name: "example fills in a secret", target: "base", file: secretExampleFile, old: "\nGPUPROXY_JWT_SECRET=\n", new: "\nGPUPROXY_JWT_SECRET=changeme\n", want: "fills in GPUPROXY_JWT_SECRET"},
		{name: "example line without =", file: secretExampleFile, old: "\nIONET_API_KEY=\n", new: "\nIONET_API_KEY\n", want: "without =: kubectl would take its value from your shell"},

		// Migrations.
		{name: "Job serves", obj: func(t *testing.T, o *kubeObjects) { jobCtr(o).Args[0] = "serve" }, want: "does not run `gpuproxy migrate`"},
		{name: "Job in parallel", obj: func(t *testing.T, o *kubeObjects) { o.Jobs[0].Spec.Parallelism = ptr(int32(2)) }, want: "runs 2 pods at once"},
		{name: "Job twice", obj: func(t *testing.T, o *kubeObjects) { o.Jobs[0].Spec.Completions = ptr(int32(2)) }, want: "migrates 2 times"},
		{name: "retry beside a failing pod", obj: func(t *testing.T, o *kubeObjects) {
			o.Jobs[0].Spec.PodReplacementPolicy = ptr(batchv1.TerminatingOrFailed)
		}, want: "podReplacementPolicy: Failed"},
		{name: "no migrate command", file: "cmd/gpuproxy/main.go", old: `case "migrate":`, new: `case "db-migrate":`, want: "no migrate command"},
		{name: "no migration lock", file: "db/db.go", old: `"SELECT pg_advisory_xact_lock(7262011)"`, new: `"SELECT 1"`, want: "takes no Postgres advisory lock"},
		{name: "replicas do not serve", obj: func(t *testing.T, o *kubeObjects) { serverCtr(o).Args = []string{"migrate"} }, want: "runs `gpuproxy serve`"},

		// Replicas, rolling updates, disruptions.
		{name: "autoscaler on another target", obj: func(t *testing.T, o *kubeObjects) { hpa(o).Spec.ScaleTargetRef.Name = "gpuproxy-old" }, want: "not the Deployment"},
		{name: "one replica", obj: func(t *testing.T, o *kubeObjects) { hpa(o).Spec.MinReplicas = ptr(int32(1)) }, want: "minReplicas is 1"},
		{name: "max below min", obj: func(t *testing.T, o *kubeObjects) { hpa(o).Spec.MaxReplicas = 2 }, want: "maxReplicas 2 is below its minReplicas 3"},
		{name: "replicas in the Deployment", obj: func(t *testing.T, o *kubeObjects) { deploy(o).Spec.Replicas = ptr(int32(3)) }, want: "reset the autoscaler's count"},
		{name: "scaling on an unrequested resource", obj: func(t *testing.T, o *kubeObjects) {
			hpa(o).Spec.Metrics[0].Resource.Name = corev1.ResourceEphemeralStorage
		}, want: "scales on ephemeral-storage utilization"},
		{name: "Recreate", obj: func(t *testing.T, o *kubeObjects) {
			deploy(o).Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
		}, want: "Recreate"},
		{name: "rollout takes all down", obj: func(t *testing.T, o *kubeObjects) {
			deploy(o).Spec.Strategy.RollingUpdate.MaxUnavailable = ptr(intstr.FromString("100%"))
		}, want: "may take 3 of 3 replicas down at once"},
		{name: "rollout cannot progress", obj: func(t *testing.T, o *kubeObjects) {
			deploy(o).Spec.Strategy.RollingUpdate.MaxSurge = ptr(intstr.FromInt32(0))
		}, want: "cannot progress"},
		{name: "rollout below the budget", target: small, obj: func(t *testing.T, o *kubeObjects) {
			deploy(o).Spec.Strategy.RollingUpdate.MaxUnavailable = ptr(intstr.FromInt32(2))
		}, want: "fewer than the PodDisruptionBudget keeps (1)"},
		{name: "budget blocks drains", target: small, obj: func(t *testing.T, o *kubeObjects) { minAvailable(o, intstr.FromInt32(2)) }, want: "allows no eviction at 2 replicas"},
		{name: "budget of 100%", obj: func(t *testing.T, o *kubeObjects) { minAvailable(o, intstr.FromString("100%")) }, want: "allows no eviction at 3 replicas"},
		{name: "budget keeps nothing", target: small, obj: func(t *testing.T, o *kubeObjects) { minAvailable(o, intstr.FromInt32(0)) }, want: "keeps no replica"},
		{name: "budget of 50% keeps one", target: small, obj: func(t *testing.T, o *kubeObjects) {
			minAvailable(o, intstr.FromString("50%"))
			deploy(o).Spec.Strategy.RollingUpdate.MaxUnavailable = ptr(intstr.FromInt32(2))
		}, want: "fewer than the PodDisruptionBudget keeps (1)"},
		{name: "budget evicts all", obj: func(t *testing.T, o *kubeObjects) { o.PDBs[0].Spec.MaxUnavailable = ptr(intstr.FromInt32(3)) }, want: "evict all 3 replicas"},
		{name: "budget evicts none", obj: func(t *testing.T, o *kubeObjects) { o.PDBs[0].Spec.MaxUnavailable = ptr(intstr.FromInt32(0)) }, want: "maxUnavailable 0 allows no eviction"},
		{name: "budget sets both", obj: func(t *testing.T, o *kubeObjects) { o.PDBs[0].Spec.MinAvailable = ptr(intstr.FromInt32(1)) }, want: "one of minAvailable and maxUnavailable"},
		{name: "budget selects nothing", obj: func(t *testing.T, o *kubeObjects) {
			o.PDBs[0].Spec.Selector.MatchLabels["app.kubernetes.io/component"] = "api"
		}, want: "selects none of the replicas"},
		{name: "budget selects the Job", obj: func(t *testing.T, o *kubeObjects) {
			delete(o.PDBs[0].Spec.Selector.MatchLabels, "app.kubernetes.io/component")
		}, want: "Job's pods, whose controller cannot scale"},

		// The Service.
		{name: "Service selects nothing", obj: func(t *testing.T, o *kubeObjects) { o.Services[0].Spec.Selector["app.kubernetes.io/name"] = "proxy" }, want: "the Service selects none"},
		{name: "Service selects the Job", obj: func(t *testing.T, o *kubeObjects) { delete(o.Services[0].Spec.Selector, "app.kubernetes.io/component") }, want: "the Service also selects"},
		{name: "Service on another port", obj: func(t *testing.T, o *kubeObjects) { o.Services[0].Spec.Ports[0].TargetPort = intstr.FromInt32(9090) }, want: "targets 9090"},
		{name: "Service without targetPort", obj: func(t *testing.T, o *kubeObjects) { o.Services[0].Spec.Ports[0].TargetPort = intstr.IntOrString{} }, want: "targets 80"},

		// Termination.
		{name: "grace at the default", obj: func(t *testing.T, o *kubeObjects) { deploy(o).Spec.Template.Spec.TerminationGracePeriodSeconds = nil }, want: "terminationGracePeriodSeconds 30"},
		{name: "longer preStop pause", obj: func(t *testing.T, o *kubeObjects) {
			serverCtr(o).Lifecycle.PreStop.Exec.Command = []string{"sleep", "20"}
		}, want: "preStop pause (20s)"},
		{name: "longer shutdown in the source", file: "app/config.go", old: "shutdownTimeout = 20 * time.Second", new: "shutdownTimeout = 40 * time.Second", want: "the shutdown (40s)"},

		// The NetworkPolicy.
		{name: "egress open", obj: func(t *testing.T, o *kubeObjects) {
			netpol(o).Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		}, want: "does not restrict egress"},
		{name: "ingress open", obj: func(t *testing.T, o *kubeObjects) {
			netpol(o).Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		}, want: "does not restrict ingress"},
		{name: "Job not covered", obj: func(t *testing.T, o *kubeObjects) {
			netpol(o).Spec.PodSelector.MatchLabels["app.kubernetes.io/component"] = "server"
		}, want: "does not select the migration Job's pods"},
		{name: "replicas not covered", obj: func(t *testing.T, o *kubeObjects) {
			netpol(o).Spec.PodSelector.MatchLabels["app.kubernetes.io/component"] = "migrate"
		}, want: "does not select the replicas"},
		{name: "egress anywhere", obj: func(t *testing.T, o *kubeObjects) {
			netpol(o).Spec.Egress = append(netpol(o).Spec.Egress, networkingv1.NetworkPolicyEgressRule{})
		}, want: "allows every destination"},
		{name: "cluster range not cut out", obj: func(t *testing.T, o *kubeObjects) {
			b := netpol(o).Spec.Egress[internetRule(t, o)].To[0].IPBlock
			b.Except = slices.DeleteFunc(b.Except, func(s string) bool { return s == "10.0.0.0/8" })
		}, want: "reaches 10.0.0.0/8"},
		{name: "link-local not cut out", obj: func(t *testing.T, o *kubeObjects) {
			b := netpol(o).Spec.Egress[internetRule(t, o)].To[0].IPBlock
			b.Except = slices.DeleteFunc(b.Except, func(s string) bool { return s == "169.254.0.0/16" })
		}, want: "reaches 169.254.0.0/16"},
		{name: "IPv6 private range not cut out", obj: func(t *testing.T, o *kubeObjects) {
			netpol(o).Spec.Egress[internetRule(t, o)].To[1].IPBlock.Except = nil
		}, want: "reaches fc00::/7"},
		{name: "Postgres range on every port", obj: func(t *testing.T, o *kubeObjects) { netpol(o).Spec.Egress[egressRule(t, o, postgresPort)].Ports = nil }, want: "reaches 10.0.0.0/8"},
		{name: "pods on another port", obj: func(t *testing.T, o *kubeObjects) {
			r := netpol(o).Spec.Egress[egressRule(t, o, dnsPort)].DeepCopy()
			r.Ports = []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromInt32(8080))}}
			netpol(o).Spec.Egress = append(netpol(o).Spec.Egress, *r)
		}, want: "reaches pods in the cluster"},
		{name: "no DNS", obj: func(t *testing.T, o *kubeObjects) {
			netpol(o).Spec.Egress = slices.Delete(netpol(o).Spec.Egress, egressRule(t, o, dnsPort), egressRule(t, o, dnsPort)+1)
		}, want: "no egress rule for DNS"},
		{name: "no Postgres", target: small, obj: func(t *testing.T, o *kubeObjects) {
			netpol(o).Spec.Egress = slices.Delete(netpol(o).Spec.Egress, egressRule(t, o, postgresPort), egressRule(t, o, postgresPort)+1)
		}, want: "no egress rule for Postgres"},
		{name: "no internet", obj: func(t *testing.T, o *kubeObjects) {
			i := internetRule(t, o)
			netpol(o).Spec.Egress = slices.Delete(netpol(o).Spec.Egress, i, i+1)
		}, want: "no egress rule reaches the internet"},
		{name: "internet on 443 only", obj: func(t *testing.T, o *kubeObjects) {
			netpol(o).Spec.Egress[internetRule(t, o)].Ports = []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromInt32(443))}}
		}, want: "limits the internet to ports"},
		{name: "ingress on every port", obj: func(t *testing.T, o *kubeObjects) { netpol(o).Spec.Ingress[0].Ports = nil }, want: "admits every port"},
		{name: "ingress on another port", obj: func(t *testing.T, o *kubeObjects) {
			netpol(o).Spec.Ingress[0].Ports[0].Port = ptr(intstr.FromInt32(9090))
		}, want: "admits port 9090"},
	} {
		t.Run(m.name, func(t *testing.T) {
			target := m.target
			if target == "" {
				target = prod
			}
			exSrc, ex := example(t, target)
			msrc := src
			if m.file != "" {
				before := src[m.file]
				if m.file == secretExampleFile {
					before = exSrc
				}
				if !strings.Contains(before, m.old) {
					t.Fatalf("%s no longer contains %q: update this mutation", m.file, m.old)
				}
				after := strings.Replace(before, m.old, m.new, 1)
				if m.file == secretExampleFile {
					ex = parseSecretExample(ex.name, after)
				} else {
					msrc = maps.Clone(src)
					msrc[m.file] = after
				}
			}
			f, factProblems := loadFacts(msrc)
			o := decodeTarget(t, target)
			if m.obj != nil {
				m.obj(t, o)
			}
			problems := append(factProblems, checkKube(o, f, ex)...)
			if !slices.ContainsFunc(problems, func(s string) bool { return strings.Contains(s, m.want) }) {
				t.Errorf("no problem mentioning %q; got %q", m.want, problems)
			}
		})
	}
}
