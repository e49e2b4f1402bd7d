package gym

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var builders = []string{BuilderPrefixMerging, BuilderPerRequest}

// call builds a stamped schema-3 entry of rollout "r". parent "" is a root.
// Logprobs are distinct per call and position so ownership mix-ups show.
func call(id string, prompt, gen []int32, parent string) TokenEntry {
	e := TokenEntry{SchemaVersion: 3, RolloutID: "r", ModelCallID: id, Model: "policy",
		PromptTokenIDs: prompt, GenerationTokenIDs: gen}
	for i, g := range gen {
		e.GenerationLogProbs = append(e.GenerationLogProbs, -float64(len(id))/8-float64(i)/16-float64(g)/1024)
	}
	e.Stamp()
	if parent == "" {
		r := ParentRoot
		e.ParentResolution = &r
	} else {
		r := ParentResolved
		p := parent
		e.ParentResolution, e.ParentCallID = &r, &p
	}
	return e
}

func toks(v ...int32) []int32 { return v }

// branchingCalls is the worked example of spec §3.4.
func branchingCalls() []TokenEntry {
	return []TokenEntry{
		call("a", toks(1, 2), toks(10, 11), ""),
		call("b", toks(1, 2, 10, 11, 3), toks(12), "a"),
		call("c", toks(1, 2, 10, 11, 4), toks(13, 14), "a"),
		call("d", toks(5, 6), toks(15), ""),
	}
}

func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}

func buildEnvelope(t *testing.T, builder string, entries []TokenEntry, terminal string) (*TrainingTraceBatch, *BuildOutput, error) {
	t.Helper()
	out, err := Build(builder, entries, terminal)
	if err != nil {
		return nil, nil, err
	}
	env, err := ProjectTrainingTraces("r", out)
	return env, out, err
}

func mustEnvelope(t *testing.T, builder string, entries []TokenEntry, terminal string) (*TrainingTraceBatch, *BuildOutput) {
	t.Helper()
	env, out, err := buildEnvelope(t, builder, entries, terminal)
	if err != nil {
		t.Fatalf("%s: %v", builder, err)
	}
	return env, out
}

func mustMask(t *testing.T, builder string, entries []TokenEntry, terminal, reason string) *MaskError {
	t.Helper()
	env, _, err := buildEnvelope(t, builder, entries, terminal)
	var me *MaskError
	if !errors.As(err, &me) {
		t.Fatalf("%s: want mask %s, got envelope %v err %v", builder, reason, env != nil, err)
	}
	if me.Reason != reason {
		t.Fatalf("%s: mask reason %q (%v), want %q", builder, me.Reason, me, reason)
	}
	return me
}

// ownedSamples maps each owning call to its (tokens, logprobs) in the envelope.
type ownedSample struct {
	Tokens   []int32
	Logprobs []float64
}

func ownedSamples(env *TrainingTraceBatch) map[string]ownedSample {
	out := map[string]ownedSample{}
	for _, tr := range env.Traces {
		for _, sp := range tr.SampledSpans {
			out[sp.ModelCallID] = ownedSample{tr.TokenIDs[sp.Start:sp.End], tr.GenerationLogprobs[sp.Start:sp.End]}
		}
	}
	return out
}

func lossTokens(env *TrainingTraceBatch) int {
	n := 0
	for _, tr := range env.Traces {
		for _, m := range tr.LossMask {
			n += int(m)
		}
	}
	return n
}

func traceCallIDs(env *TrainingTraceBatch) [][]string {
	var out [][]string
	for _, tr := range env.Traces {
		out = append(out, tr.ModelCallIDs)
	}
	return out
}

// §10.2 item 1 and §3.4: every permutation, both builders.
func TestWorkedExampleEveryPermutation(t *testing.T) {
	calls := branchingCalls()
	wantTraces := map[string][][]string{
		BuilderPrefixMerging: {{"a", "b"}, {"a", "c"}, {"d"}},
		BuilderPerRequest:    {{"a"}, {"b"}, {"c"}, {"d"}},
	}
	for _, b := range builders {
		t.Run(b, func(t *testing.T) {
			ref, out := mustEnvelope(t, b, calls, "")
			if d := cmp.Diff(wantTraces[b], traceCallIDs(ref)); d != "" {
				t.Fatalf("traces (-want +got)\n%s", d)
			}
			if n := lossTokens(ref); n != 6 {
				t.Fatalf("loss tokens %d, want 6 = |a|+|b|+|c|+|d|", n)
			}
			if out.Notes.DeliveredFraction != 1.0 {
				t.Fatalf("delivered_fraction %v", out.Notes.DeliveredFraction)
			}
			if got := len(ownedSamples(ref)); got != 4 {
				t.Fatalf("%d owners, want every call owned once", got)
			}
			refJSON := ref.AppendJSON(nil)
			for _, p := range permutations(len(calls)) {
				perm := make([]TokenEntry, len(calls))
				for i, j := range p {
					perm[i] = calls[j]
				}
				env, _ := mustEnvelope(t, b, perm, "")
				if got := env.AppendJSON(nil); string(got) != string(refJSON) {
					t.Fatalf("order %v changed the envelope:\n%s\nvs\n%s", p, got, refJSON)
				}
			}
		})
	}
}

// §10.2 item 2: trace a→c masks the ancestor copy and keeps the exact context.
func TestPrefixProjectionMasksAncestorCopy(t *testing.T) {
	env, _ := mustEnvelope(t, BuilderPrefixMerging, branchingCalls(), "")
	var ac *TrainingTrace
	for i := range env.Traces {
		if env.Traces[i].TraceID == "r:c" {
			ac = &env.Traces[i]
		}
	}
	if ac == nil {
		t.Fatalf("no trace r:c in %v", traceCallIDs(env))
	}
	c := branchingCalls()[2]
	want := TrainingTrace{TraceID: "r:c", ModelCallIDs: []string{"a", "c"},
		TokenIDs: toks(1, 2, 10, 11, 4, 13, 14), LossMask: []int8{0, 0, 0, 0, 0, 1, 1},
		GenerationLogprobs: []float64{0, 0, 0, 0, 0, c.GenerationLogProbs[0], c.GenerationLogProbs[1]},
		SampledSpans:       []SampledSpan{{ModelCallID: "c", Start: 5, End: 7}}}
	if d := cmp.Diff(want, *ac); d != "" {
		t.Fatalf("(-want +got)\n%s", d)
	}
}

// §10.2 item 3: both representation modes own identical sampled data.
func TestBothBuildersOwnIdenticalSamples(t *testing.T) {
	pm, _ := mustEnvelope(t, BuilderPrefixMerging, branchingCalls(), "")
	pr, _ := mustEnvelope(t, BuilderPerRequest, branchingCalls(), "")
	if d := cmp.Diff(ownedSamples(pm), ownedSamples(pr)); d != "" {
		t.Fatalf("(-prefix_merging +per_request)\n%s", d)
	}
	// And each owned sample is exactly the captured generation.
	for _, c := range branchingCalls() {
		got := ownedSamples(pm)[c.ModelCallID]
		if d := cmp.Diff(ownedSample{c.GenerationTokenIDs, c.GenerationLogProbs}, got); d != "" {
			t.Fatalf("call %s (-captured +owned)\n%s", c.ModelCallID, d)
		}
	}
	// per_request traces are full prompt + generation.
	for _, tr := range pr.Traces {
		c := branchingCalls()[tr.ModelCallIDs[0][0]-'a']
		if d := cmp.Diff(c.Cumulative(), tr.TokenIDs); d != "" {
			t.Fatalf("per_request trace %s (-full +got)\n%s", tr.TraceID, d)
		}
	}
}

// §10.2 item 4: a compaction root (an unrelated prompt that is its own root)
// is preserved as its own trace under both builders.
func TestCompactionRootPreserved(t *testing.T) {
	calls := []TokenEntry{
		call("m1", toks(1, 2), toks(3), ""),
		call("m2", toks(1, 2, 3, 4), toks(5), "m1"),
		// After compaction: a summary prompt that does not extend m2.
		call("s1", toks(9, 8, 7), toks(6, 6), ""),
		call("s2", toks(9, 8, 7, 6, 6, 1), toks(2), "s1"),
	}
	for _, b := range builders {
		env, _ := mustEnvelope(t, b, calls, "s2")
		owned := ownedSamples(env)
		if len(owned) != 4 || lossTokens(env) != 5 {
			t.Fatalf("%s: owners %d loss %d", b, len(owned), lossTokens(env))
		}
		if b == BuilderPrefixMerging {
			if d := cmp.Diff([][]string{{"m1", "m2"}, {"s1", "s2"}}, traceCallIDs(env)); d != "" {
				t.Fatalf("(-want +got)\n%s", d)
			}
		}
	}
	// Legacy (main_chain) prefix_merging keeps one main chain, truncated at
	// the terminal, and labels the rest branches.
	out, err := PrefixMerging(calls, "s1", false)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string][]string{}
	for _, ch := range out.Chains {
		for _, l := range ch.Links {
			ids[ch.ChainID] = append(ids[ch.ChainID], l.Entry.ModelCallID)
		}
	}
	if d := cmp.Diff(map[string][]string{"main": {"s1"}, "branch-0": {"m1", "m2"}}, ids); d != "" {
		t.Fatalf("legacy chains (-want +got)\n%s", d)
	}
	if out.Notes.TerminalChain != TerminalDelivered {
		t.Fatalf("legacy terminal %q", out.Notes.TerminalChain)
	}
}

// §10.2 item 5.
func TestDuplicateDelivery(t *testing.T) {
	for _, b := range builders {
		calls := branchingCalls()
		dup := calls[1]
		dup.CreatedAt = 99 // a transport retry differs only in created_at
		ref, _ := mustEnvelope(t, b, calls, "")
		env, _ := mustEnvelope(t, b, append(calls, dup, calls[0]), "")
		if d := cmp.Diff(ref, env); d != "" {
			t.Fatalf("%s: identical duplicate changed the envelope (-want +got)\n%s", b, d)
		}
		bad := calls[1]
		bad.GenerationLogProbs = []float64{-3}
		me := mustMask(t, b, append(branchingCalls(), bad), "", ReasonUnresolvedCustody)
		if !strings.Contains(me.Msg, "b") {
			t.Fatalf("%s: mask does not name the call: %v", b, me)
		}
		out, _ := Build(b, append(branchingCalls(), bad), "")
		if out.Notes.ParentLinkFailures[noteDuplicateConflict] != 1 {
			t.Fatalf("%s: failures %v", b, out.Notes.ParentLinkFailures)
		}
	}
}

// retryCalls: root a, then two retries b1/b2 of the same child prompt.
func retryCalls() []TokenEntry {
	return []TokenEntry{
		call("a", toks(1, 2), toks(10), ""),
		call("b1", toks(1, 2, 10, 3), toks(20), "a"),
		call("b2", toks(1, 2, 10, 3), toks(21), "a"),
	}
}

// §10.2 item 6.
func TestAmbiguousRetryMasks(t *testing.T) {
	for _, b := range builders {
		mustMask(t, b, retryCalls(), "", ReasonUnresolvedCustody)
		// Off the terminal path: the terminal is on another root.
		calls := append(retryCalls(), call("z", toks(7), toks(8), ""))
		mustMask(t, b, calls, "z", ReasonUnresolvedCustody)
		// Retried roots with no evidence also mask.
		mustMask(t, b, []TokenEntry{call("r1", toks(1), toks(2), ""), call("r2", toks(1), toks(3), "")}, "", ReasonUnresolvedCustody)
	}
}

// §10.2 item 7: the terminal names b1, and b2 has a verified child: both kept.
func TestTerminalAndExtendedSiblingKept(t *testing.T) {
	calls := append(retryCalls(), call("c", toks(1, 2, 10, 3, 21, 4), toks(30), "b2"))
	for _, b := range builders {
		env, out := mustEnvelope(t, b, calls, "b1")
		if len(out.Quarantined) != 0 {
			t.Fatalf("%s: quarantined %v", b, out.Quarantined)
		}
		owned := ownedSamples(env)
		for _, id := range []string{"a", "b1", "b2", "c"} {
			if _, ok := owned[id]; !ok {
				t.Fatalf("%s: %s not owned: %v", b, id, traceCallIDs(env))
			}
		}
	}
}

// §10.2 item 8.
func TestRetrySelectionExcludesAbandoned(t *testing.T) {
	for _, b := range builders {
		// Selected by the terminal.
		env, out := mustEnvelope(t, b, retryCalls(), "b2")
		if _, ok := ownedSamples(env)["b1"]; ok || len(out.Quarantined) != 1 || out.Quarantined[0] != "b1" {
			t.Fatalf("%s terminal: b1 delivered or not quarantined (%v)", b, out.Quarantined)
		}
		for _, tr := range env.Traces {
			for _, c := range tr.ModelCallIDs {
				if c == "b1" {
					t.Fatalf("%s: abandoned b1 appears in %s", b, tr.TraceID)
				}
			}
		}
		// Selected by a child (no terminal).
		calls := append(retryCalls(), call("c", toks(1, 2, 10, 3, 20, 5), toks(31), "b1"))
		env, _ = mustEnvelope(t, b, calls, "")
		if _, ok := ownedSamples(env)["b2"]; ok {
			t.Fatalf("%s child: abandoned b2 delivered", b)
		}
		if len(ownedSamples(env)) != 3 {
			t.Fatalf("%s child: owners %v", b, ownedSamples(env))
		}
	}
}

// deltaOf rewrites a full-prompt child as a delta record (prompt = suffix
// after the parent's cumulative tokens).
func deltaOf(e TokenEntry, parentCum int) TokenEntry {
	e.PromptTokenIDs = append([]int32(nil), e.PromptTokenIDs[parentCum:]...)
	e.PromptIsDelta = true
	return e
}

// §10.2 item 9.
func TestDeltaPrompts(t *testing.T) {
	full := branchingCalls()
	delta := []TokenEntry{full[0], deltaOf(full[1], 4), deltaOf(full[2], 4), full[3]}
	// grandchild of c as a delta of a delta
	gc := call("e", toks(1, 2, 10, 11, 4, 13, 14, 8), toks(16), "c")
	full = append(full, gc)
	delta = append(delta, deltaOf(gc, 7))
	for _, b := range builders {
		want, _ := mustEnvelope(t, b, full, "")
		for _, p := range [][]int{{0, 1, 2, 3, 4}, {4, 3, 2, 1, 0}, {2, 4, 0, 3, 1}} {
			perm := make([]TokenEntry, len(p))
			for i, j := range p {
				perm[i] = delta[j]
			}
			got, _ := mustEnvelope(t, b, perm, "")
			if d := cmp.Diff(want, got); d != "" {
				t.Fatalf("%s: delta reconstruction differs (-full +delta)\n%s", b, d)
			}
		}
		// Orphan delta: its parent was never captured.
		orphan := deltaOf(call("o", toks(1, 2, 10, 11, 9), toks(17), "zz"), 4)
		mustMask(t, b, append(branchingCalls(), orphan), "", ReasonUnresolvedCustody)
		// A delta whose digest does not match the reconstruction.
		wrong := deltaOf(full[1], 4)
		wrong.PromptTokenIDs = toks(4) // claims c's interstitial but b's digest
		out, _ := Build(b, []TokenEntry{full[0], wrong}, "")
		if out.Notes.ParentLinkFailures[noteDeltaUnreconstruct] != 1 {
			t.Fatalf("%s: mismatched delta not refused: %v", b, out.Notes.ParentLinkFailures)
		}
		// A cycle of deltas is unreconstructable, not a hang.
		x := call("x", toks(1), toks(2), "y")
		y := call("y", toks(3), toks(4), "x")
		x.PromptIsDelta, y.PromptIsDelta = true, true
		mustMask(t, b, []TokenEntry{x, y}, "", ReasonUnresolvedCustody)
	}
}

// §10.2 item 10: unsupported or unproven evidence is not delivered.
func TestUnprovenEvidenceMasks(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(e *TokenEntry)
		reason string
	}{
		{"wrong rollout_id", func(e *TokenEntry) { e.RolloutID = "other" }, ReasonForeignRollout},
		{"parent_resolution unresolved", func(e *TokenEntry) {
			u := ParentUnresolved
			e.ParentResolution, e.ParentCallID = &u, nil
		}, ReasonUnresolvedCustody},
		{"bad digest", func(e *TokenEntry) { d := ComputeDigest(toks(1)); e.Digest = &d }, ReasonProofMismatch},
		{"bad cum_len", func(e *TokenEntry) { n := *e.CumLen + 1; e.CumLen = &n }, ReasonProofMismatch},
		{"NaN logprob", func(e *TokenEntry) { e.GenerationLogProbs[0] = math.NaN() }, ReasonInvalidEnvelope},
		{"routed_experts", func(e *TokenEntry) { e.RoutedExperts = json.RawMessage(`[[1,2]]`) }, ReasonRoutedExperts},
	}
	for _, tc := range cases {
		for _, b := range builders {
			t.Run(tc.name+"/"+b, func(t *testing.T) {
				calls := branchingCalls()
				tc.mutate(&calls[2])
				mustMask(t, b, calls, "", tc.reason)
			})
		}
	}
}

// §10.2 item 11: an unknown declared terminal, or mixed models, fail closed.
func TestDeclaredTerminalAndMixedModels(t *testing.T) {
	withResp := func() []TokenEntry {
		calls := branchingCalls()
		for i := range calls {
			id := "resp-" + calls[i].ModelCallID
			calls[i].ResponseID = &id
		}
		return calls
	}
	for _, b := range builders {
		snap := &Snapshot{RolloutID: "r", Entries: withResp(), SnapshotID: "s", Version: 1}
		_, _, err := BuildTrainingTraces(snap, b, TerminalWitnesses{DeclaredResponseID: "resp-nope"})
		var me *MaskError
		if !errors.As(err, &me) || me.Reason != ReasonTerminalUnavailable {
			t.Fatalf("%s: unknown declared terminal: %v", b, err)
		}
		env, m, err := BuildTrainingTraces(snap, b, TerminalWitnesses{DeclaredResponseID: "resp-c", HaveResponse: true, ResponseID: "resp-c"})
		if err != nil || m.TerminalAttribution.CallID != "c" || m.TerminalAttribution.Method != "declared" {
			t.Fatalf("%s: declared terminal: %v %+v", b, err, m.TerminalAttribution)
		}
		if len(ownedSamples(env)) != 4 {
			t.Fatalf("%s: owners %v", b, ownedSamples(env))
		}
		mixed := withResp()
		mixed[3].Model = "other-policy"
		_, _, err = BuildTrainingTraces(&Snapshot{RolloutID: "r", Entries: mixed}, b, TerminalWitnesses{})
		if !errors.As(err, &me) || me.Reason != ReasonMixedModels {
			t.Fatalf("%s: mixed models: %v", b, err)
		}
	}
}

// §10.2 item 12.
func TestEmptyPromptOrGenerationMasks(t *testing.T) {
	for _, b := range builders {
		mustMask(t, b, []TokenEntry{call("a", nil, toks(1, 2), "")}, "", ReasonEmptyPrompt)
		mustMask(t, b, []TokenEntry{call("a", toks(1), nil, ""), call("b", toks(2), nil, "")}, "", ReasonNoTrainableCalls)
		// An empty-generation call among good ones is dropped, not trained.
		calls := append(branchingCalls(), call("e", toks(1, 2, 10, 11, 5), nil, "a"))
		env, out := mustEnvelope(t, b, calls, "")
		if len(out.Notes.EmptyGenerationCalls) != 1 || len(ownedSamples(env)) != 4 {
			t.Fatalf("%s: empty generation handling %v", b, out.Notes.EmptyGenerationCalls)
		}
	}
}

// §10.2 item 18: direct projection rejects a wrong rollout and an
// unavailable terminal.
func TestProjectionRejectsWrongRolloutAndTerminal(t *testing.T) {
	for _, b := range builders {
		out, err := Build(b, branchingCalls(), "")
		if err != nil {
			t.Fatal(err)
		}
		var me *MaskError
		if _, err := ProjectTrainingTraces("not-r", out); !errors.As(err, &me) || me.Reason != ReasonForeignRollout {
			t.Fatalf("%s: wrong rollout: %v", b, err)
		}
		out, _ = Build(b, branchingCalls(), "missing-call")
		if _, err := ProjectTrainingTraces("r", out); !errors.As(err, &me) || me.Reason != ReasonTerminalUnavailable {
			t.Fatalf("%s: unavailable terminal: %v", b, err)
		}
		// A terminal behind an unresolved boundary is broken.
		calls := branchingCalls()
		u := ParentUnresolved
		calls[1].ParentResolution, calls[1].ParentCallID = &u, nil
		out, _ = Build(b, calls, "b")
		if out.Notes.TerminalChain != TerminalBroken {
			t.Fatalf("%s: terminal chain %q, want broken", b, out.Notes.TerminalChain)
		}
	}
	if _, err := Build("fancy", branchingCalls(), ""); err == nil {
		t.Fatal("unknown builder accepted")
	}
}

// Parent resolution rules of §3.1 step 7, including prefix-trie recovery and
// the rewritten-full-prompt root.
func TestParentResolutionRules(t *testing.T) {
	a := call("a", toks(1, 2), toks(3), "")
	// The claimed parent "gone" is absent; a's cumulative [1,2,3] prefixes the prompt.
	recov := call("b", toks(1, 2, 3, 4), toks(5), "gone")
	// Rewritten full prompt: resolved to a, but the template rewrote a's turn.
	rewritten := call("c", toks(1, 2, 99, 4), toks(6), "a")
	// No resolution and no claim: nonconforming.
	bare := call("d", toks(7), toks(8), "")
	bare.ParentResolution = nil
	out, err := PrefixMerging([]TokenEntry{a, recov, rewritten, bare}, "", true)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{noteParentMissingRecover: 1, noteDigestMismatch: 1, noteMissingResolution: 1}
	if d := cmp.Diff(want, out.Notes.ParentLinkFailures); d != "" {
		t.Fatalf("notes (-want +got)\n%s", d)
	}
	if d := cmp.Diff([]string{"d"}, out.Notes.UnresolvedParentCalls); d != "" {
		t.Fatalf("unresolved (-want +got)\n%s", d)
	}
	chains := map[string]bool{}
	for _, ch := range out.Chains {
		var ids []string
		for _, l := range ch.Links {
			ids = append(ids, l.Entry.ModelCallID)
		}
		chains[strings.Join(ids, ",")] = true
	}
	// b recovered under a; c is a clean independent root; d its own root.
	if d := cmp.Diff(map[string]bool{"a,b": true, "c": true, "d": true}, chains); d != "" {
		t.Fatalf("chains (-want +got)\n%s", d)
	}
	// Legacy mode has no rewritten-root exception: c is unresolved.
	legacy, _ := PrefixMerging([]TokenEntry{a, rewritten}, "", false)
	if d := cmp.Diff([]string{"c"}, legacy.Notes.UnresolvedParentCalls); d != "" {
		t.Fatalf("legacy unresolved (-want +got)\n%s", d)
	}
	// The rewritten-root rule needs both proofs: without a digest c is unresolved.
	noDigest := rewritten
	noDigest.Digest = nil
	out, _ = PrefixMerging([]TokenEntry{a, noDigest}, "", true)
	if d := cmp.Diff([]string{"c"}, out.Notes.UnresolvedParentCalls); d != "" {
		t.Fatalf("no-digest unresolved (-want +got)\n%s", d)
	}
	// Ambiguous recovery: two identical cumulative candidates.
	a2 := call("a2", toks(1, 2), toks(3), "")
	out, _ = PrefixMerging([]TokenEntry{a, a2, recov}, "", true)
	if out.Notes.ParentLinkFailures[noteParentMissing] != 1 {
		t.Fatalf("ambiguous recovery not refused: %v", out.Notes.ParentLinkFailures)
	}
}

func TestResolveTerminalWitnesses(t *testing.T) {
	calls := branchingCalls()
	for i := range calls {
		id := "resp-" + calls[i].ModelCallID
		calls[i].ResponseID = &id
	}
	cases := []struct {
		name   string
		w      TerminalWitnesses
		call   string
		method string
		miss   bool
	}{
		{"none", TerminalWitnesses{}, "", "", false},
		{"explicit", TerminalWitnesses{ExplicitCallID: "b"}, "b", "explicit", false},
		{"explicit miss abstains", TerminalWitnesses{ExplicitCallID: "zz", HaveResponse: true, ResponseID: "resp-c"}, "c", "response_id", false},
		{"response id", TerminalWitnesses{HaveResponse: true, ResponseID: "resp-d"}, "d", "response_id", false},
		{"agree", TerminalWitnesses{ExplicitCallID: "c", HaveResponse: true, ResponseID: "resp-c"}, "c", "explicit", false},
		{"disagree", TerminalWitnesses{ExplicitCallID: "b", HaveResponse: true, ResponseID: "resp-c"}, "", "", false},
		{"declared miss", TerminalWitnesses{DeclaredResponseID: "x", ExplicitCallID: "b"}, "", "", true},
	}
	for _, tc := range cases {
		got := ResolveTerminal(calls, tc.w)
		if got.CallID != tc.call || got.Method != tc.method || got.DeclaredMiss != tc.miss {
			t.Errorf("%s: got %+v", tc.name, got)
		}
	}
	// Identical sequences collapse to the smallest id.
	dup := calls[3]
	dup.ModelCallID = "c0"
	same := "resp-d"
	dup.ResponseID = &same
	got := ResolveTerminal(append(calls, dup), TerminalWitnesses{HaveResponse: true, ResponseID: "resp-d"})
	if got.CallID != "c0" {
		t.Fatalf("collapse: %+v", got)
	}
}

// Spec §3.5 step 9 groups retries by parent first: two calls with the same
// prompt under different parents are not retries of each other. Roots a
// and b end on the same tokens (1 2 | 3 4 and 1 2 3 | 4), so their
// children c and d share a prompt; both builders keep all four calls, with
// no unresolved retry (grouped by prompt alone, c and d would be an
// ambiguous retry and mask the rollout).
func TestSamePromptUnderDifferentParentsIsNoRetry(t *testing.T) {
	calls := []TokenEntry{
		call("a", toks(1, 2), toks(3, 4), ""),
		call("b", toks(1, 2, 3), toks(4), ""),
		call("c", toks(1, 2, 3, 4, 5), toks(6), "a"),
		call("d", toks(1, 2, 3, 4, 5), toks(7), "b"),
	}
	for _, b := range builders {
		env, out := mustEnvelope(t, b, calls, "")
		if len(out.Notes.UnresolvedRetries) != 0 || len(out.Quarantined) != 0 {
			t.Errorf("%s: unresolved retries %v, quarantined %v", b, out.Notes.UnresolvedRetries, out.Quarantined)
		}
		owned := ownedSamples(env)
		for _, id := range []string{"a", "b", "c", "d"} {
			if _, ok := owned[id]; !ok {
				t.Errorf("%s: %s not owned: %v", b, id, traceCallIDs(env))
			}
		}
	}
}
