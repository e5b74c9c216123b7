package providers

import (
	"errors"
	"strings"
)

// ImageLogin is a private registry's login as vast.ai's image_login
// carries it: "-u USER -p TOKEN [REGISTRY]" (docker login's flags and
// host). Secret is a credential: it never goes into a log, an error, an
// event or a response.
type ImageLogin struct {
	User, Secret string
	// Registry is the registry host ("ghcr.io"); "" for Docker Hub.
	Registry string
}

// ErrImageLoginForm is ParseImageLogin's refusal. It never quotes the
// login.
var ErrImageLoginForm = errors.New(`must be "-u USER -p TOKEN [REGISTRY]", as vast.ai's image_login and docker login take it`)

// ParseImageLogin reads an image_login: "-u USER -p TOKEN [REGISTRY]",
// the flags in either order, the registry host last. Anything else is
// ErrImageLoginForm.
func ParseImageLogin(s string) (ImageLogin, error) {
	var l ImageLogin
	f := strings.Fields(s)
	for i := 0; i < len(f); i++ {
		switch {
		case (f[i] == "-u" || f[i] == "--username") && i+1 < len(f) && l.User == "":
			i++
			l.User = f[i]
		case (f[i] == "-p" || f[i] == "--password") && i+1 < len(f) && l.Secret == "":
			i++
			l.Secret = f[i]
		case i == len(f)-1 && !strings.HasPrefix(f[i], "-"):
			l.Registry = f[i]
		default:
			return ImageLogin{}, ErrImageLoginForm
		}
	}
	if l.User == "" || l.Secret == "" {
		return ImageLogin{}, ErrImageLoginForm
	}
	return l, nil
}

// CreateChecker is a provider that can tell, without calling anyone,
// whether it can carry out a create as asked besides its offer: the
// image, env, ports, start script, entrypoint arguments and registry
// login. A refusal is a KindInvalid *Error naming the caller's field, so
// a create is refused before anything is admitted, and a rent by spec
// skips a provider that cannot do it.
type CreateChecker interface {
	CheckCreate(req CreateRequest) error
}
