package yamlconf

// EnvSecret is a secret an environment variable may supply instead of the
// configuration file, so that a Kubernetes Secret (not the whole file)
// holds it.
type EnvSecret struct {
	Var string  // the environment variable, e.g. TETHER_ADMIN_TOKEN
	Dst *string // the configuration field it sets
	// Skip leaves Dst alone: the variable does not apply to this
	// configuration (a NATS password when the file names no user).
	Skip bool
}

// ApplyEnv sets each secret from its variable when the variable is
// non-empty: the environment wins over the file. Call it after Decode and
// before validation.
func ApplyEnv(getenv func(string) string, secrets ...EnvSecret) {
	for _, s := range secrets {
		if v := getenv(s.Var); v != "" && !s.Skip {
			*s.Dst = v
		}
	}
}
