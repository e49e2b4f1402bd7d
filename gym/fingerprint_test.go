package gym

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"strings"
	"testing"
)

type fingerprintGolden struct {
	Meta  map[string]any `json:"meta"`
	Cases []struct {
		Name        string `json:"name"`
		Items       string `json:"items"`
		Fingerprint string `json:"fingerprint"`
		Error       string `json:"error"`
	} `json:"cases"`
}

// minFingerprintCases is the fewest golden cases the test accepts, so an
// emptied or truncated golden file fails instead of passing vacuously.
const minFingerprintCases = 200

// TestContentFingerprintMatchesIndependentPython checks AssistantFingerprint
// byte for byte against scripts/golden_fingerprint.py, an independent
// implementation of Gym's FINGERPRINT_VERSION 3 algorithm (cross-checked
// against Gym's own fingerprint.py by scripts/gym_differential.py),
// including which inputs Gym refuses (ValueError/TypeError) and on which its
// code crashes (AttributeError).
func TestContentFingerprintMatchesIndependentPython(t *testing.T) {
	b, err := os.ReadFile("testdata/golden_fingerprint.json")
	if err != nil {
		t.Fatal(err)
	}
	var g fingerprintGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if g.Meta["script"] != "scripts/golden_fingerprint.py" || g.Meta["fingerprint_version"] != float64(FingerprintVersion) {
		t.Fatalf("golden metadata %v does not name the script and fingerprint version %d", g.Meta, FingerprintVersion)
	}
	if len(g.Cases) < minFingerprintCases {
		t.Fatalf("golden has %d cases, want at least %d", len(g.Cases), minFingerprintCases)
	}
	kinds := map[string]int{}
	for _, c := range g.Cases {
		list, err := parsePy([]byte(c.Items), false)
		if err != nil || list.kind != pyList {
			t.Fatalf("%s: items do not parse: %v", c.Name, err)
		}
		got, err := assistantFingerprint(list.list)
		gotErr := ""
		switch {
		case errors.Is(err, errPyCrash):
			gotErr = "crash"
		case errors.Is(err, errPyValue):
			gotErr = "value"
		case err != nil:
			t.Fatalf("%s: unexpected error class %v", c.Name, err)
		}
		if got != c.Fingerprint || gotErr != c.Error {
			t.Errorf("%s: got (%q, %q %v), want (%q, %q)\nitems %s", c.Name, got, gotErr, err, c.Fingerprint, c.Error, c.Items)
		}
		kinds[c.Error]++
	}
	if kinds[""] == 0 || kinds["value"] == 0 || kinds["crash"] == 0 {
		t.Fatalf("golden lacks a class of outcome: %v", kinds)
	}
}

// TestOrjsonFloatForm pins the float forms orjson 3.8 writes (observed from
// orjson itself), which differ from Python's repr.
func TestOrjsonFloatForm(t *testing.T) {
	cases := []struct {
		f    float64
		want string
	}{
		{1, "1.0"}, {1e16, "1e16"}, {1e15, "1000000000000000.0"}, {123456789012345678, "1.2345678901234568e17"},
		{1e-7, "1e-7"}, {1.5e-5, "0.000015"}, {1e-4, "0.0001"}, {math.Copysign(0, -1), "-0.0"}, {1e22, "1e22"},
		{1.7976931348623157e308, "1.7976931348623157e308"}, {5e-324, "5e-324"}, {12345.678, "12345.678"}, {-0.00012, "-0.00012"},
	}
	for _, c := range cases {
		if got := string(appendRyu(nil, c.f)); got != c.want {
			t.Errorf("orjson(%v) = %s, want %s", c.f, got, c.want)
		}
	}
}

// TestPythonFloatRepr pins repr(float), which _ng_token_capture and the
// envelope use: positional for exponents -4..15, else d.ddde±XX.
func TestPythonFloatRepr(t *testing.T) {
	cases := []struct {
		f    float64
		want string
	}{
		{1, "1.0"}, {0, "0.0"}, {1764512345.123, "1764512345.123"}, {1e15, "1000000000000000.0"}, {1e16, "1e+16"},
		{1.5e-5, "1.5e-05"}, {1e-4, "0.0001"}, {1234567, "1234567.0"}, {-2.5, "-2.5"}, {0.9999, "0.9999"},
	}
	for _, c := range cases {
		if got := string(appendPyFloatRepr(nil, c.f)); got != c.want {
			t.Errorf("repr(%v) = %s, want %s", c.f, got, c.want)
		}
		if got := string(appendPyFloat(nil, c.f)); got != c.want {
			t.Errorf("appendPyFloat(%v) = %s, want %s", c.f, got, c.want)
		}
	}
}

// FuzzContentFingerprint feeds arbitrary item lists to the fingerprint: it
// must never panic, be deterministic, return "" or 64 hex digits, and keep
// errors in the two classes Gym's code can produce.
func FuzzContentFingerprint(f *testing.F) {
	b, err := os.ReadFile("testdata/golden_fingerprint.json")
	if err == nil {
		var g fingerprintGolden
		if json.Unmarshal(b, &g) == nil {
			for _, c := range g.Cases {
				f.Add([]byte(c.Items))
			}
		}
	}
	f.Add([]byte(`[{"role":"assistant","content":"x"}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		list, err := parsePy(data, false)
		if err != nil {
			if !errors.Is(err, errPyValue) {
				t.Fatalf("parse error of the wrong class: %v", err)
			}
			return
		}
		if list.kind != pyList {
			return
		}
		a, errA := assistantFingerprint(list.list)
		b, errB := assistantFingerprint(list.list)
		if a != b || (errA == nil) != (errB == nil) {
			t.Fatalf("not deterministic: %q %v / %q %v", a, errA, b, errB)
		}
		if errA != nil && !errors.Is(errA, errPyValue) && !errors.Is(errA, errPyCrash) {
			t.Fatalf("error of the wrong class: %v", errA)
		}
		if errA == nil && a != "" && (len(a) != 64 || strings.Trim(a, "0123456789abcdef") != "") {
			t.Fatalf("not a sha256 hex digest: %q", a)
		}
	})
}
