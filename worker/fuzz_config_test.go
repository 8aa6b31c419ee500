package worker

import "testing"

// FuzzParseConfig (added by the reliability suite): any YAML either parses
// into a configuration that validates again, or is refused with a
// non-empty message; nothing panics.
func FuzzParseConfig(f *testing.F) {
	f.Add("instance_id: w1\nmodel: m\n")
	f.Add("instance_id: w1\nmodel: m\nfleet: generation\nserver_role: generation\nranks: 4\nenable_attention_dp: true\n" +
		"internal_request_auth_key: 0123456789abcdef0123\nnats: {url: \"nats://127.0.0.1:4222\", user: u, password: p}\n")
	f.Add("instance_id: w1\nmodel: m\nengine: {type: proxy, upstreams: [\"http://127.0.0.1:8000\"]}\n")
	f.Add("instance_id: w.1\n")
	f.Add("colour: blue\n")
	f.Add("[")
	f.Add("")
	f.Fuzz(func(t *testing.T, data string) {
		t.Setenv(EnvInternalRequestAuthKey, "")
		cfg, err := ParseConfig([]byte(data))
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("empty error message for %q", data)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("a parsed config no longer validates: %v\n%s", err, data)
		}
	})
}
