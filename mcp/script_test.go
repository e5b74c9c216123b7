package mcp_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestScript drives the plain endpoint through scripts/test-mcp.sh.
func TestScript(t *testing.T) {
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	s := newStack(t, stackOpts{})
	key, _ := s.key("acme", "engineer")
	run := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command("bash", append([]string{"../scripts/test-mcp.sh"}, args...)...)
		cmd.Env = append(os.Environ(), "GPUPROXY_URL="+s.url, "GPUPROXY_API_KEY="+key)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return string(out), 0
		case errors.As(err, &ee):
			return string(out), ee.ExitCode()
		}
		t.Fatalf("running the script: %v", err)
		return "", -1
	}
	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"tools/list"}, `"get_spending_info"`, 0},
		{[]string{"list"}, `"create_gpu_instance"`, 0},
		{[]string{"tools/call", "get_spending_info"}, `"windows"`, 0},
		{[]string{"call", "check_spending_limit", `{"estimated_cost": 2.5}`}, `"allowed"`, 0},
		{[]string{"tools/call", "check_spending_limit", `{"estimated_cost": "lots"}`}, `"isError"`, 1},
		{[]string{"tools/call", "no_such_tool"}, `-32602`, 1},
		{[]string{"resources/read", "spending://current"}, `spending://current`, 0},
		{[]string{"read", "billing://transactions"}, `totals`, 0},
		{[]string{"resources/list"}, `instances://mine`, 0},
		{[]string{"initialize"}, `"protocolVersion"`, 0},
		{[]string{"ping"}, `"result"`, 0},
		{[]string{"tools/frobnicate"}, `-32601`, 1},
		{[]string{"tools/call", `bad"name`}, `bad name`, 2},
		{[]string{}, `usage`, 2},
	} {
		out, code := run(tc.args...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("test-mcp.sh %q: exit %d, want %d with %q:\n%s", tc.args, code, tc.code, tc.want, out)
		}
	}
}
