package deploycheck_test

// The checks on the rendered Kubernetes manifests. Like the compose
// checks, each reports problems instead of failing, so that
// TestKubernetesChecksCatchBreakage can break a rendered copy (or the
// product source the facts come from) and see every check fail.

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// kubeSecretName is the Secret the manifests reference by name and each
// secret.example.env describes.
const kubeSecretName = "gpuproxy"

// secretExampleFile is each kustomization's example of that Secret.
const secretExampleFile = "secret.example.env"

// goRuntimeEnv are variables the Go runtime reads, which a container may
// set besides gpuproxy's own.
var goRuntimeEnv = map[string]bool{"GOGC": true, "GOMEMLIMIT": true, "GOMAXPROCS": true, "GODEBUG": true}

// clusterRanges are the private and link-local ranges where pod and
// service networks (and cloud metadata endpoints) live: the internet rule
// must cut them out.
var clusterRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("fc00::/7"), netip.MustParsePrefix("fe80::/10")}

const (
	postgresPort = 5432
	dnsPort      = 53
)

// secretExample is a parsed secret.example.env, read as `kubectl create
// secret generic --from-env-file` reads it: KEY=VALUE lines, values
// verbatim, # comment lines and blank lines skipped.
type secretExample struct {
	name      string
	keys      []string
	values    map[string]string
	commented map[string]bool
	problems  []string
}

func parseSecretExample(name, src string) secretExample {
	ex := secretExample{name: name, values: map[string]string{}, commented: map[string]bool{}}
	comment := false
	for i, line := range strings.Split(src, "\n") {
		line = strings.TrimLeft(line, " \t")
		switch {
		case strings.TrimSpace(line) == "":
			comment = false
		case strings.HasPrefix(line, "#"):
			comment = true
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				ex.problems = append(ex.problems, fmt.Sprintf("%s:%d: %q without =: kubectl would take its value from your shell", name, i+1, line))
				continue
			}
			if _, dup := ex.values[k]; dup {
				ex.problems = append(ex.problems, fmt.Sprintf("%s:%d: %s listed twice", name, i+1, k))
			}
			ex.keys = append(ex.keys, k)
			ex.values[k] = v
			ex.commented[k] = comment
		}
	}
	return ex
}

// kubeCheck collects the problems of one rendering.
type kubeCheck struct {
	o        *kubeObjects
	f        sourceFacts
	problems []string
	// serverConfig is the gpuproxy.yaml the replicas read.
	serverConfig string
}

func (c *kubeCheck) bad(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// checkKube returns what is wrong with a rendering o, given the product's
// facts f and the rendering's Secret example ex.
func checkKube(o *kubeObjects, f sourceFacts, ex secretExample) []string {
	c := &kubeCheck{o: o, f: f}
	one := func(kind string, n int) bool {
		if n != 1 {
			c.bad("want exactly one %s, rendered %d", kind, n)
		}
		return n == 1
	}
	ok := one("Deployment", len(o.Deployments))
	ok = one("Job", len(o.Jobs)) && ok
	ok = one("Service", len(o.Services)) && ok
	ok = one("PodDisruptionBudget", len(o.PDBs)) && ok
	ok = one("HorizontalPodAutoscaler", len(o.HPAs)) && ok
	ok = one("NetworkPolicy", len(o.NetworkPolicies)) && ok
	for _, s := range o.Secrets {
		c.bad("a Secret (%s) is rendered: its values would live in the manifests; reference the Secret %q by name and create it from %s",
			s.Name, kubeSecretName, secretExampleFile)
	}
	if !ok {
		return c.problems
	}
	d, job := o.Deployments[0], o.Jobs[0]
	dpod, jpod := &d.Spec.Template.Spec, &job.Spec.Template.Spec
	server := runs(dpod, "serve")
	if server == nil {
		c.bad("no container of the Deployment runs `gpuproxy serve` (args %q)", argsOf(dpod))
		return c.problems
	}
	listenPort := c.listen(dpod, server)

	for _, p := range []struct {
		what string
		spec *corev1.PodSpec
	}{{"the Deployment", dpod}, {"the migration Job", jpod}} {
		c.security(p.what, p.spec)
		for _, ctr := range allContainers(p.spec) {
			c.image(p.what, ctr)
			c.resources(p.what, ctr)
		}
	}
	if ji, di := firstImage(jpod), firstImage(dpod); ji != di {
		c.bad("the migration Job runs image %q, the Deployment %q: migrations must come from the same build", ji, di)
	}
	c.probes(server, listenPort)
	c.grace(dpod, server)
	c.secrets(dpod, jpod, server, ex)
	c.migration(job, dpod, server)
	r, pdbKeeps := c.replicas(d), 0
	if r > 0 {
		pdbKeeps = c.pdb(d, job, r)
		c.rollout(d, r, pdbKeeps)
	}
	c.service(d, job, server, listenPort)
	c.networkPolicy(d, job, server, listenPort)
	return c.problems
}

// allContainers are a pod's init containers and containers.
func allContainers(p *corev1.PodSpec) []*corev1.Container {
	var out []*corev1.Container
	for i := range p.InitContainers {
		out = append(out, &p.InitContainers[i])
	}
	for i := range p.Containers {
		out = append(out, &p.Containers[i])
	}
	return out
}

// runs is the pod's container whose arguments start with the gpuproxy
// command cmd.
func runs(p *corev1.PodSpec, cmd string) *corev1.Container {
	for _, ctr := range allContainers(p) {
		if len(ctr.Args) > 0 && ctr.Args[0] == cmd {
			return ctr
		}
	}
	return nil
}

func argsOf(p *corev1.PodSpec) [][]string {
	var out [][]string
	for _, ctr := range allContainers(p) {
		out = append(out, ctr.Args)
	}
	return out
}

func firstImage(p *corev1.PodSpec) string {
	if len(p.Containers) == 0 {
		return ""
	}
	return p.Containers[0].Image
}

// flagArg finds -name V, --name V, -name=V or --name=V in args.
func flagArg(args []string, name string) (string, bool) {
	for i, a := range args {
		for _, p := range []string{"-" + name, "--" + name} {
			if a == p && i+1 < len(args) {
				return args[i+1], true
			}
			if v, ok := strings.CutPrefix(a, p+"="); ok {
				return v, true
			}
		}
	}
	return "", false
}

// envLiteral is the literal value a container sets for name.
func envLiteral(ctr *corev1.Container, name string) (string, bool) {
	for _, e := range ctr.Env {
		if e.Name == name && e.ValueFrom == nil {
			return e.Value, true
		}
	}
	return "", false
}

// secretRef is where a container takes name from a Secret, or nil.
func secretRef(ctr *corev1.Container, name string) *corev1.SecretKeySelector {
	for _, e := range ctr.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return e.ValueFrom.SecretKeyRef
		}
	}
	return nil
}

// configFile is the gpuproxy.yaml a container reads with -c, from the
// ConfigMap mounted there; "" with no -c.
func (c *kubeCheck) configFile(what string, p *corev1.PodSpec, ctr *corev1.Container) string {
	path, ok := flagArg(ctr.Args, "c")
	if !ok {
		return ""
	}
	for _, m := range ctr.VolumeMounts {
		key, inside := "", false
		switch {
		case m.SubPath != "" && path == m.MountPath:
			key, inside = m.SubPath, true
		case m.SubPath == "" && strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/"):
			key, inside = strings.TrimPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/"), true
		}
		if !inside {
			continue
		}
		for _, v := range p.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			for _, it := range v.ConfigMap.Items {
				if it.Path == key {
					key = it.Key
				}
			}
			for _, cm := range c.o.ConfigMaps {
				if cm.Name == v.ConfigMap.Name {
					if s, ok := cm.Data[key]; ok {
						return s
					}
				}
			}
		}
	}
	c.bad("%s reads -c %s, which no mounted ConfigMap provides: gpuproxy would not start", what, path)
	return ""
}

// listen checks the address serve listens on (--listen, else
// GPUPROXY_LISTEN, else gpuproxy.yaml's listen, else the default) and the
// configuration file, and returns the port.
func (c *kubeCheck) listen(p *corev1.PodSpec, ctr *corev1.Container) int {
	c.serverConfig = c.configFile("the Deployment", p, ctr)
	cfg := c.config(c.serverConfig)
	listen, from := c.f.defaultListen, "gpuproxy's default"
	if v, _ := cfg["listen"].(string); v != "" {
		listen, from = v, "gpuproxy.yaml"
	}
	if v, ok := envLiteral(ctr, "GPUPROXY_LISTEN"); ok && v != "" {
		listen, from = v, "GPUPROXY_LISTEN"
	}
	if v, ok := flagArg(ctr.Args, "listen"); ok {
		listen, from = v, "--listen"
	}
	host, portText, err := net.SplitHostPort(listen)
	port, perr := strconv.Atoi(portText)
	if err != nil || perr != nil {
		c.bad("gpuproxy listens on %q (%s), not HOST:PORT", listen, from)
		return -1
	}
	if host != "" && host != "0.0.0.0" && host != "::" {
		c.bad("gpuproxy listens on %s (%s): only inside its pod, where neither the probes nor the Service reach it", listen, from)
	}
	if !slices.ContainsFunc(ctr.Ports, func(cp corev1.ContainerPort) bool { return int(cp.ContainerPort) == port }) {
		c.bad("gpuproxy listens on port %d (%s), the container declares %v", port, from, ctr.Ports)
	}
	if !slices.Contains(c.f.exposed, port) {
		c.bad("gpuproxy listens on port %d (%s), which the Dockerfile does not EXPOSE (%v)", port, from, c.f.exposed)
	}

	// The settings every replica must share, set once.
	oauth, _ := cfg["oauth"].(map[string]any)
	issuer, _ := oauth["issuer"].(string)
	if v, ok := envLiteral(ctr, "GPUPROXY_OAUTH_ISSUER"); ok && v != "" {
		issuer = v
	}
	if disabled, _ := oauth["disabled"].(bool); !disabled {
		if issuer == "" {
			c.bad("oauth.issuer is not set: every replica must name the same issuer, so set it once in gpuproxy.yaml")
		} else if u, err := url.Parse(issuer); err != nil || u.Scheme != "https" || u.Host == "" {
			c.bad("oauth.issuer %q is not an https URL", issuer)
		}
	}
	return port
}

// config decodes gpuproxy.yaml and reports keys gpuproxy does not know
// (it refuses to start on them) and secrets written into it.
func (c *kubeCheck) config(text string) map[string]any {
	cfg := map[string]any{}
	if text == "" {
		return cfg
	}
	if err := yaml.UnmarshalStrict([]byte(text), &cfg); err != nil {
		c.bad("gpuproxy.yaml does not parse: %v", err)
		return cfg
	}
	var walk func(m map[string]any, keys configKeys, prefix string)
	walk = func(m map[string]any, keys configKeys, prefix string) {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			node, known := keys[k]
			if !known {
				c.bad("gpuproxy.yaml: unknown key %s%s: gpuproxy refuses to start (cmd/gpuproxy config)", prefix, k)
				continue
			}
			if node == nil {
				if v, _ := m[k].(string); v != "" && secretKey(k) {
					c.bad("gpuproxy.yaml sets %s%s: secrets come from the Secret %q, never the ConfigMap", prefix, k, kubeSecretName)
				}
				continue
			}
			items := []any{m[k]}
			if node.list {
				items, _ = m[k].([]any)
			}
			for _, it := range items {
				if sub, ok := it.(map[string]any); ok {
					walk(sub, node.keys, prefix+k+".")
				}
			}
		}
	}
	walk(cfg, c.f.config, "")
	return cfg
}

// secretKey tells a gpuproxy.yaml key that holds a secret.
func secretKey(k string) bool {
	return k == "database_url" || strings.HasSuffix(k, "secret") || k == "api_key" || k == "token"
}

// isSecretEnv tells an environment variable that holds a secret.
func isSecretEnv(name string) bool {
	return name == "DATABASE_URL" || strings.HasSuffix(name, "_SECRET") || strings.HasSuffix(name, "_API_KEY") ||
		strings.HasSuffix(name, "_TOKEN")
}

// image: the Dockerfile's image, pinned, run with its ENTRYPOINT.
func (c *kubeCheck) image(what string, ctr *corev1.Container) {
	ref, digest, _ := strings.Cut(ctr.Image, "@")
	repo, tag := ref, ""
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		repo, tag = ref[:i], ref[i+1:]
	}
	if name := repo[strings.LastIndex(repo, "/")+1:]; name != c.f.image {
		c.bad("%s container %s runs image %q, not the Dockerfile's image %q", what, ctr.Name, ctr.Image, c.f.image)
	}
	switch {
	case tag == "" && digest == "":
		c.bad("%s container %s runs image %q with no tag: that is latest, whatever was pushed last", what, ctr.Name, ctr.Image)
	case tag == "latest":
		c.bad("%s container %s runs image %q: never latest, replicas would run whatever was pushed last", what, ctr.Name, ctr.Image)
	}
	if ctr.Command != nil && !slices.Equal(ctr.Command, c.f.entrypoint) {
		c.bad("%s container %s overrides the image's ENTRYPOINT %q with %q", what, ctr.Name, c.f.entrypoint, ctr.Command)
	}
}

// security: non-root, read-only root file system, no privilege, no
// service account token.
func (c *kubeCheck) security(what string, p *corev1.PodSpec) {
	psc := p.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	if p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken {
		c.bad("%s mounts a service account token (automountServiceAccountToken): gpuproxy never calls the Kubernetes API", what)
	}
	for _, ctr := range allContainers(p) {
		sc := ctr.SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
		}
		nonRoot, uid := psc.RunAsNonRoot, psc.RunAsUser
		if sc.RunAsNonRoot != nil {
			nonRoot = sc.RunAsNonRoot
		}
		if sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		if nonRoot == nil || !*nonRoot {
			c.bad("%s container %s does not set runAsNonRoot", what, ctr.Name)
		}
		if uid != nil && *uid == 0 {
			c.bad("%s container %s runs as root (runAsUser 0)", what, ctr.Name)
		}
		if user, _, _ := strings.Cut(c.f.imageUser, ":"); uid == nil {
			if n, err := strconv.Atoi(user); err != nil || n == 0 {
				c.bad("%s container %s sets no runAsUser and the image's USER %q is not a non-zero number: the kubelet cannot verify runAsNonRoot", what, ctr.Name, c.f.imageUser)
			}
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			c.bad("%s container %s does not set readOnlyRootFilesystem", what, ctr.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			c.bad("%s container %s does not set allowPrivilegeEscalation: false", what, ctr.Name)
		}
		if sc.Privileged != nil && *sc.Privileged {
			c.bad("%s container %s is privileged", what, ctr.Name)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			c.bad("%s container %s does not drop ALL capabilities", what, ctr.Name)
		}
		seccomp := psc.SeccompProfile
		if sc.SeccompProfile != nil {
			seccomp = sc.SeccompProfile
		}
		if seccomp == nil || (seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault && seccomp.Type != corev1.SeccompProfileTypeLocalhost) {
			c.bad("%s container %s runs without a seccompProfile (RuntimeDefault)", what, ctr.Name)
		}
	}
}

// resources: requests for CPU and memory, a memory limit no lower.
func (c *kubeCheck) resources(what string, ctr *corev1.Container) {
	req, lim := ctr.Resources.Requests, ctr.Resources.Limits
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := req[r]; !ok || q.IsZero() {
			c.bad("%s container %s requests no %s: the scheduler and the autoscaler cannot account for it", what, ctr.Name, r)
		}
	}
	ml, ok := lim[corev1.ResourceMemory]
	if !ok || ml.IsZero() {
		c.bad("%s container %s has no memory limit", what, ctr.Name)
	} else if mr, ok := req[corev1.ResourceMemory]; ok && ml.Cmp(mr) < 0 {
		c.bad("%s container %s: memory limit %s is below its request %s", what, ctr.Name, ml.String(), mr.String())
	}
}

// resolvePort is the container port a probe or Service port names.
func resolvePort(ctr *corev1.Container, p intstr.IntOrString) int {
	if p.Type == intstr.Int {
		return int(p.IntVal)
	}
	for _, cp := range ctr.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort)
		}
	}
	return -1
}

// probes: readiness on /ready, liveness on /health, each a GET route of
// the root router (no credentials) on the port gpuproxy listens on.
func (c *kubeCheck) probes(ctr *corev1.Container, port int) {
	check := func(kind string, p *corev1.Probe, want string) {
		if p == nil {
			if want != "" {
				c.bad("the gpuproxy container has no %s", kind)
			}
			return
		}
		if p.HTTPGet == nil {
			c.bad("%s is not an HTTP GET: it would not check what the server's routes answer", kind)
			return
		}
		path, _, _ := strings.Cut(p.HTTPGet.Path, "?")
		if want != "" && path != want {
			c.bad("%s GETs %q, want %q", kind, path, want)
		}
		switch uncond, found := c.f.rootGETs[path]; {
		case !found:
			c.bad("%s GETs %q, which is not a GET route of the root router in server/routes.go (%v)",
				kind, path, slices.Sorted(maps.Keys(c.f.rootGETs)))
		case !uncond:
			c.bad("%s GETs %q, which server/routes.go registers only conditionally", kind, path)
		}
		if got := resolvePort(ctr, p.HTTPGet.Port); got != port {
			c.bad("%s probes port %s (%d), gpuproxy listens on %d", kind, p.HTTPGet.Port.String(), got, port)
		}
		if p.HTTPGet.Scheme != "" && p.HTTPGet.Scheme != corev1.URISchemeHTTP {
			c.bad("%s uses %s: gpuproxy serves plain HTTP", kind, p.HTTPGet.Scheme)
		}
	}
	check("readinessProbe", ctr.ReadinessProbe, "/ready")
	check("livenessProbe", ctr.LivenessProbe, "/health")
	check("startupProbe", ctr.StartupProbe, "")
	if rp := ctr.ReadinessProbe; rp != nil {
		timeout := time.Duration(max(rp.TimeoutSeconds, 1)) * time.Second // 0: the default, 1 s
		if timeout <= c.f.readyTimeout {
			c.bad("readinessProbe timeoutSeconds %d is not longer than /ready's own wait for the database (%s, server/handlers.go): a slow answer would read as not ready",
				rp.TimeoutSeconds, c.f.readyTimeout)
		}
	}
}

// preStopSeconds is how long the container's preStop hook pauses.
func preStopSeconds(ctr *corev1.Container) int {
	if ctr.Lifecycle == nil || ctr.Lifecycle.PreStop == nil {
		return 0
	}
	h := ctr.Lifecycle.PreStop
	if h.Sleep != nil {
		return int(h.Sleep.Seconds)
	}
	if h.Exec != nil {
		words := strings.Fields(strings.Join(h.Exec.Command, " "))
		for i, w := range words {
			if (w == "sleep" || strings.HasSuffix(w, "/sleep")) && i+1 < len(words) {
				n, _ := strconv.Atoi(words[i+1])
				return n
			}
		}
	}
	return 0
}

// grace: Kubernetes waits longer than stopping takes.
func (c *kubeCheck) grace(p *corev1.PodSpec, ctr *corev1.Container) {
	grace := int64(30) // Kubernetes' default
	if p.TerminationGracePeriodSeconds != nil {
		grace = *p.TerminationGracePeriodSeconds
	}
	pre := preStopSeconds(ctr)
	need := time.Duration(pre)*time.Second + c.f.shutdownTimeout + c.f.closeTimeout
	if time.Duration(grace)*time.Second <= need {
		c.bad("terminationGracePeriodSeconds %d is not longer than the preStop pause (%ds), the shutdown (%s) and the flush after it (%s) (app/config.go): replicas would be killed mid-drain",
			grace, pre, c.f.shutdownTimeout, c.f.closeTimeout)
	}
}

// secrets: secrets only from the one Secret, never inline; the shared
// ones set for every replica; every key referenced is in the example.
func (c *kubeCheck) secrets(dpod, jpod *corev1.PodSpec, server *corev1.Container, ex secretExample) {
	referenced := map[string]bool{}
	for _, p := range []struct {
		what string
		spec *corev1.PodSpec
	}{{"the Deployment", dpod}, {"the migration Job", jpod}} {
		for _, ctr := range allContainers(p.spec) {
			for _, e := range ctr.Env {
				if !c.f.envNames[e.Name] && !goRuntimeEnv[e.Name] {
					c.bad("%s sets %s, which gpuproxy does not read (cmd/gpuproxy envOverrides)", p.what, e.Name)
				}
				ref := (*corev1.SecretKeySelector)(nil)
				if e.ValueFrom != nil {
					ref = e.ValueFrom.SecretKeyRef
				}
				if isSecretEnv(e.Name) && ref == nil {
					c.bad("%s sets %s inline: secrets come from the Secret %q", p.what, e.Name, kubeSecretName)
				}
				if ref != nil {
					if ref.Name != kubeSecretName {
						c.bad("%s takes %s from the Secret %q, want %q (the one %s describes)", p.what, e.Name, ref.Name, kubeSecretName, secretExampleFile)
					}
					referenced[ref.Key] = true
				}
			}
			for _, ef := range ctr.EnvFrom {
				if ef.SecretRef == nil {
					continue
				}
				if ef.SecretRef.Name != kubeSecretName {
					c.bad("%s imports the Secret %q, want %q", p.what, ef.SecretRef.Name, kubeSecretName)
				}
				for _, k := range ex.keys {
					referenced[k] = true
					if name := ef.Prefix + k; !c.f.envNames[name] {
						c.bad("%s imports %s from the Secret as %s, which gpuproxy does not read", p.what, k, name)
					}
				}
			}
		}
	}
	require := func(what string, ctr *corev1.Container, name, why string) *corev1.SecretKeySelector {
		var ref *corev1.SecretKeySelector
		if ctr != nil {
			ref = secretRef(ctr, name)
		}
		switch {
		case ref == nil:
			c.bad("%s does not set %s from the Secret: %s", what, name, why)
		case ref.Optional != nil && *ref.Optional:
			c.bad("%s takes %s from the Secret as optional: %s", what, name, why)
		}
		return ref
	}
	dbRef := require("the Deployment", server, "DATABASE_URL", "each replica would open a SQLite file of its own")
	require("the Deployment", server, "GPUPROXY_CONSOLE_SECRET",
		"each replica would sign console sessions with a random secret of its own, and a sign-in would hold on one replica only")
	if mig := runs(jpod, "migrate"); mig != nil {
		jobRef := require("the migration Job", mig, "DATABASE_URL", "it would migrate a SQLite file, not the replicas' Postgres")
		if dbRef != nil && jobRef != nil && *dbRef != *jobRef {
			c.bad("the migration Job's DATABASE_URL (%s/%s) is not the replicas' (%s/%s)", jobRef.Name, jobRef.Key, dbRef.Name, dbRef.Key)
		}
		if c.configFile("the migration Job", jpod, mig) != c.serverConfig {
			c.bad("the migration Job reads another gpuproxy.yaml than the replicas")
		}
	}

	c.problems = append(c.problems, ex.problems...)
	for _, k := range slices.Sorted(maps.Keys(referenced)) {
		if _, ok := ex.values[k]; !ok {
			c.bad("the Secret key %s is referenced but %s does not list it: a Secret made from the example lacks it, and the pods would not start", k, ex.name)
		}
	}
	for _, k := range ex.keys {
		if !referenced[k] {
			c.bad("%s lists %s, which nothing references", ex.name, k)
		}
		if !ex.commented[k] {
			c.bad("%s lists %s without a comment saying what it is", ex.name, k)
		}
		if ex.values[k] != "" {
			c.bad("%s fills in %s: an example leaves every value empty", ex.name, k)
		}
	}
}

// migration: one Job runs `gpuproxy migrate` once, and migrating takes
// the lock that keeps replicas migrating at start from racing it.
func (c *kubeCheck) migration(job *batchv1.Job, dpod *corev1.PodSpec, server *corev1.Container) {
	if runs(&job.Spec.Template.Spec, "migrate") == nil {
		c.bad("the migration Job does not run `gpuproxy migrate` (args %q)", argsOf(&job.Spec.Template.Spec))
	}
	if p := job.Spec.Parallelism; p != nil && *p > 1 {
		c.bad("the migration Job runs %d pods at once", *p)
	}
	if n := job.Spec.Completions; n != nil && *n > 1 {
		c.bad("the migration Job migrates %d times", *n)
	}
	if p := job.Spec.PodReplacementPolicy; p == nil || *p != batchv1.Failed {
		c.bad("the migration Job may start a retry while the failed pod still runs: set podReplacementPolicy: Failed")
	}
	if !c.f.migrateCommand {
		c.bad("cmd/gpuproxy has no migrate command for the Job to run")
	}
	if !c.f.migrateLock {
		c.bad("db.Store.Migrate takes no Postgres advisory lock: replicas migrating at start would race the Job and each other")
	}
}

// replicas: the autoscaler owns the count, at least 2. It returns the
// least count (0 if unknown).
func (c *kubeCheck) replicas(d *appsv1.Deployment) int {
	hpa := c.o.HPAs[0]
	ref := hpa.Spec.ScaleTargetRef
	if ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" || ref.Name != d.Name {
		c.bad("the HorizontalPodAutoscaler scales %s %s %q, not the Deployment %q", ref.APIVersion, ref.Kind, ref.Name, d.Name)
		return 0
	}
	r := 1
	if hpa.Spec.MinReplicas != nil {
		r = int(*hpa.Spec.MinReplicas)
	}
	if r < 2 {
		c.bad("the HorizontalPodAutoscaler's minReplicas is %d: want at least 2, so that one replica down leaves one serving", r)
	}
	if int(hpa.Spec.MaxReplicas) < r {
		c.bad("the HorizontalPodAutoscaler's maxReplicas %d is below its minReplicas %d", hpa.Spec.MaxReplicas, r)
	}
	if d.Spec.Replicas != nil {
		c.bad("the Deployment sets replicas: %d: every kubectl apply would reset the autoscaler's count to it", *d.Spec.Replicas)
	}
	for _, m := range hpa.Spec.Metrics {
		if m.Resource == nil {
			continue
		}
		for _, ctr := range d.Spec.Template.Spec.Containers {
			if _, ok := ctr.Resources.Requests[m.Resource.Name]; !ok {
				c.bad("the HorizontalPodAutoscaler scales on %s utilization, which container %s does not request", m.Resource.Name, ctr.Name)
			}
		}
	}
	return r
}

// selects tells whether sel selects pods labelled l.
func selects(sel *metav1.LabelSelector, l map[string]string) bool {
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(labels.Set(l))
}

// pdb: evictions possible, one replica always left. It returns how many
// replicas the budget keeps at the least count r.
func (c *kubeCheck) pdb(d *appsv1.Deployment, job *batchv1.Job, r int) int {
	pdb := c.o.PDBs[0]
	if !selects(pdb.Spec.Selector, d.Spec.Template.Labels) {
		c.bad("the PodDisruptionBudget selects none of the replicas")
	}
	if selects(pdb.Spec.Selector, job.Spec.Template.Labels) {
		c.bad("the PodDisruptionBudget also selects the migration Job's pods, whose controller cannot scale: their eviction fails")
	}
	minA, maxU := pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable
	if (minA == nil) == (maxU == nil) {
		c.bad("the PodDisruptionBudget must set one of minAvailable and maxUnavailable")
		return 1
	}
	if minA != nil {
		m, _ := intstr.GetScaledValueFromIntOrPercent(minA, r, true)
		if m < 1 {
			c.bad("the PodDisruptionBudget's minAvailable %s keeps no replica", minA.String())
		}
		if m >= r {
			c.bad("the PodDisruptionBudget's minAvailable %s allows no eviction at %d replicas: node drains would block", minA.String(), r)
		}
		return m
	}
	u, _ := intstr.GetScaledValueFromIntOrPercent(maxU, r, true)
	if u < 1 {
		c.bad("the PodDisruptionBudget's maxUnavailable %s allows no eviction: node drains would block", maxU.String())
	}
	if u >= r {
		c.bad("the PodDisruptionBudget's maxUnavailable %s lets a drain evict all %d replicas at once", maxU.String(), r)
	}
	return r - u
}

// rollout: a rolling update that progresses and never drops below what
// the budget keeps.
func (c *kubeCheck) rollout(d *appsv1.Deployment, r, keeps int) {
	st := d.Spec.Strategy
	if st.Type == appsv1.RecreateDeploymentStrategyType {
		c.bad("the Deployment's strategy is Recreate: an upgrade stops every replica at once")
		return
	}
	quarter := intstr.FromString("25%") // Kubernetes' default for both
	mu, ms := &quarter, &quarter
	if ru := st.RollingUpdate; ru != nil {
		if ru.MaxUnavailable != nil {
			mu = ru.MaxUnavailable
		}
		if ru.MaxSurge != nil {
			ms = ru.MaxSurge
		}
	}
	unavail, _ := intstr.GetScaledValueFromIntOrPercent(mu, r, false)
	surge, _ := intstr.GetScaledValueFromIntOrPercent(ms, r, true)
	if unavail == 0 && surge == 0 {
		c.bad("a rolling update with maxSurge %s and maxUnavailable %s cannot progress", ms.String(), mu.String())
	}
	if left := r - unavail; left < max(keeps, 1) {
		c.bad("a rolling update may take %d of %d replicas down at once, leaving %d: fewer than the PodDisruptionBudget keeps (%d)",
			unavail, r, left, max(keeps, 1))
	}
}

// service: it selects the replicas only, on the port gpuproxy listens on.
func (c *kubeCheck) service(d *appsv1.Deployment, job *batchv1.Job, server *corev1.Container, port int) {
	svc := c.o.Services[0]
	sel := &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}
	if len(svc.Spec.Selector) == 0 || !selects(sel, d.Spec.Template.Labels) {
		c.bad("the Service selects none of the replicas (selector %v)", svc.Spec.Selector)
	}
	if len(svc.Spec.Selector) > 0 && selects(sel, job.Spec.Template.Labels) {
		c.bad("the Service also selects the migration Job's pods, which serve nothing")
	}
	for _, p := range svc.Spec.Ports {
		tp := p.TargetPort
		if tp.Type == intstr.Int && tp.IntVal == 0 {
			tp = intstr.FromInt32(p.Port)
		}
		if got := resolvePort(server, tp); got != port {
			c.bad("the Service's port %d targets %s (%d), gpuproxy listens on %d", p.Port, tp.String(), got, port)
		}
	}
}

// onlyPorts tells whether rule r lists ports and every one is n (with
// one of protocols; none given means TCP).
func onlyPorts(ports []networkingv1.NetworkPolicyPort, n int, protocols ...corev1.Protocol) bool {
	if len(ports) == 0 {
		return false
	}
	for _, p := range ports {
		proto := corev1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if p.Port == nil || p.Port.Type != intstr.Int || int(p.Port.IntVal) != n || p.EndPort != nil || !slices.Contains(protocols, proto) {
			return false
		}
	}
	return true
}

// networkPolicy: the pods reach Postgres, DNS and the internet, nothing
// else in the cluster; only the API port is reachable.
func (c *kubeCheck) networkPolicy(d *appsv1.Deployment, job *batchv1.Job, server *corev1.Container, port int) {
	np := c.o.NetworkPolicies[0]
	if !selects(&np.Spec.PodSelector, d.Spec.Template.Labels) {
		c.bad("the NetworkPolicy does not select the replicas")
	}
	if !selects(&np.Spec.PodSelector, job.Spec.Template.Labels) {
		c.bad("the NetworkPolicy does not select the migration Job's pods")
	}
	types := np.Spec.PolicyTypes
	if !slices.Contains(types, networkingv1.PolicyTypeEgress) {
		c.bad("the NetworkPolicy does not restrict egress (policyTypes %v)", types)
	}
	if !slices.Contains(types, networkingv1.PolicyTypeIngress) {
		c.bad("the NetworkPolicy does not restrict ingress (policyTypes %v)", types)
	}
	for i, r := range np.Spec.Ingress {
		if len(r.Ports) == 0 {
			c.bad("ingress rule %d admits every port", i+1)
		}
		for _, p := range r.Ports {
			if p.Port == nil || resolvePort(server, *p.Port) != port {
				c.bad("ingress rule %d admits port %v, not gpuproxy's %d", i+1, p.Port, port)
			}
		}
	}
	dns, pg, internet := false, false, false
	for i, r := range np.Spec.Egress {
		switch {
		case len(r.To) == 0:
			c.bad("egress rule %d allows every destination, the cluster's pods included", i+1)
			continue
		case onlyPorts(r.Ports, dnsPort, corev1.ProtocolUDP, corev1.ProtocolTCP):
			dns = true
			continue
		case onlyPorts(r.Ports, postgresPort, corev1.ProtocolTCP):
			pg = true
			continue
		}
		for _, peer := range r.To {
			if peer.IPBlock == nil {
				c.bad("egress rule %d reaches pods in the cluster on ports %v: only Postgres (%d) and DNS (%d) may be", i+1, r.Ports, postgresPort, dnsPort)
				continue
			}
			cidr, err := netip.ParsePrefix(peer.IPBlock.CIDR)
			if err != nil {
				c.bad("egress rule %d: %v", i+1, err)
				continue
			}
			var except []netip.Prefix
			for _, e := range peer.IPBlock.Except {
				if p, err := netip.ParsePrefix(e); err == nil {
					except = append(except, p)
				}
			}
			for _, private := range clusterRanges {
				covered := slices.ContainsFunc(except, func(e netip.Prefix) bool {
					return e.Bits() <= private.Bits() && e.Contains(private.Addr())
				})
				if cidr.Overlaps(private) && !covered {
					c.bad("egress rule %d reaches %s, a private range where pod and service networks live", i+1, private)
				}
			}
			if cidr.Bits() == 0 && cidr.Addr().Is4() {
				internet = true
				if len(r.Ports) > 0 {
					c.bad("egress rule %d limits the internet to ports %v: instances' endpoints and webhooks use any port", i+1, r.Ports)
				}
			}
		}
	}
	if !dns {
		c.bad("no egress rule for DNS (port %d): provider and instance names would not resolve", dnsPort)
	}
	if !pg {
		c.bad("no egress rule for Postgres (port %d)", postgresPort)
	}
	if !internet {
		c.bad("no egress rule reaches the internet (0.0.0.0/0): providers, instances and webhooks would be cut off")
	}
}
