package gym

import (
	"encoding/json"
	"errors"
	"strings"
)

// TerminalAttribution names the captured call whose response the verifier
// scored (spec §3.6; Gym's terminal.py), or records why none could be named.
type TerminalAttribution struct {
	CallID string // "" when unattributed
	// Method is the first agreeing witness: "explicit", "declared",
	// "response_id", "content_cumulative" or "content_output"; "" when
	// unattributed.
	Method string
	Reason string // abstentions, disagreements and corroborations, comma-separated
	// DeclaredMiss is set when a declared response id matched no entry or
	// several different ones: declarations are authoritative, so the
	// rollout must be masked.
	DeclaredMiss bool
	// Disagreement is set when witnesses named calls with different token
	// sequences (Reason holds witness_disagreement[...]).
	Disagreement bool
	// Crash is set when Gym's own attribution raises on this input (an
	// AttributeError in its fingerprint of malformed tool_calls), so Gym's
	// finalizer cannot attribute either; Reason says where.
	Crash bool
}

// TerminalWitnesses are the terminal evidence a rollout record carries.
type TerminalWitnesses struct {
	ExplicitCallID     string // _ng_terminal_model_call_id (soft)
	DeclaredResponseID string // terminal_response_id (authoritative)
	ResponseID         string // str(response.id or "")
	HaveResponse       bool   // the record's response is a JSON object
	// ResponseOutput is the raw JSON of response.output (nil when absent):
	// the items the content witness fingerprints.
	ResponseOutput json.RawMessage
}

func sequenceIdentity(e *TokenEntry) string {
	if e.Digest != nil && *e.Digest != "" && e.CumLen != nil {
		return "d:" + *e.Digest + ":" + itoa(*e.CumLen)
	}
	return "t:" + tokensKey(e.PromptTokenIDs) + "|" + tokensKey(e.GenerationTokenIDs)
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	neg := n < 0
	if neg {
		n = -n
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

// collapseIdentical reduces candidates with one full token sequence to the
// smallest call id; different sequences are ambiguous (nil).
func collapseIdentical(cands []*TokenEntry) *TokenEntry {
	if len(cands) == 0 {
		return nil
	}
	id := sequenceIdentity(cands[0])
	best := cands[0]
	for _, c := range cands[1:] {
		if sequenceIdentity(c) != id {
			return nil
		}
		if c.ModelCallID < best.ModelCallID {
			best = c
		}
	}
	return best
}

// ResolveTerminal joins the record's terminal evidence to one captured call
// with Gym's four witnesses (explicit, declared, response_id, content).
// Witnesses that name the same call, or calls with identical full token
// sequences, corroborate; disagreement attributes nothing. It never fails;
// Crash reports the inputs on which Gym's own code raises.
func ResolveTerminal(entries []TokenEntry, w TerminalWitnesses) TerminalAttribution {
	var reasons []string
	// Gym indexes by a dict comprehension: the last entry of an id wins.
	byID := make(map[string]*TokenEntry, len(entries))
	for i := range entries {
		byID[entries[i].ModelCallID] = &entries[i]
	}
	type witness struct {
		method string
		entry  *TokenEntry
	}
	var ws []witness
	if w.ExplicitCallID != "" {
		if e := byID[w.ExplicitCallID]; e != nil {
			ws = append(ws, witness{"explicit", e})
		} else {
			reasons = append(reasons, "explicit_terminal_not_captured")
		}
	}
	matching := func(id string) []*TokenEntry {
		var out []*TokenEntry
		for i := range entries {
			if entries[i].ResponseID != nil && *entries[i].ResponseID == id {
				out = append(out, &entries[i])
			}
		}
		return out
	}
	if w.DeclaredResponseID != "" {
		m := matching(w.DeclaredResponseID)
		winner := collapseIdentical(m)
		if winner == nil {
			if len(m) > 0 {
				reasons = append(reasons, "declared_ambiguous")
			} else {
				reasons = append(reasons, "declared_terminal_not_captured")
			}
			return TerminalAttribution{Reason: strings.Join(reasons, ","), DeclaredMiss: true}
		}
		ws = append(ws, witness{"declared", winner})
	}
	if w.HaveResponse {
		if w.ResponseID != "" {
			m := matching(w.ResponseID)
			switch winner := collapseIdentical(m); {
			case len(m) == 0:
				reasons = append(reasons, "response_id_no_match")
			case winner == nil:
				reasons = append(reasons, "response_id_ambiguous")
			default:
				ws = append(ws, witness{"response_id", winner})
			}
		} else {
			reasons = append(reasons, "response_has_no_id")
		}
		method, e, err := contentWitness(entries, w.ResponseOutput, &reasons)
		if err != nil {
			reasons = append(reasons, "content_witness_raises["+err.Error()+"]")
			return TerminalAttribution{Reason: strings.Join(reasons, ","), Crash: true}
		}
		if e != nil {
			ws = append(ws, witness{method, e})
		}
	} else {
		reasons = append(reasons, "no_response_object")
	}
	if len(ws) == 0 {
		return TerminalAttribution{Reason: strings.Join(reasons, ",")}
	}
	all := make([]*TokenEntry, len(ws))
	for i, x := range ws {
		all[i] = x.entry
	}
	if collapseIdentical(all) == nil {
		parts := make([]string, len(ws))
		for i, x := range ws {
			parts[i] = x.method + "=" + x.entry.ModelCallID
		}
		reasons = append(reasons, "witness_disagreement["+strings.Join(parts, ";")+"]")
		return TerminalAttribution{Reason: strings.Join(reasons, ","), Disagreement: true}
	}
	if len(ws) > 1 {
		others := make([]string, 0, len(ws)-1)
		for _, x := range ws[1:] {
			others = append(others, x.method)
		}
		reasons = append(reasons, "corroborated_by="+strings.Join(others, "+"))
	}
	return TerminalAttribution{CallID: ws[0].entry.ModelCallID, Method: ws[0].method, Reason: strings.Join(reasons, ",")}
}

// contentWitness is Gym's content witness: the fingerprint of the
// response's model-authored output items, read three ways and pooled
// before the ambiguity decision: an entry's continuation_fingerprint (a
// full transcript, when stamped with FINGERPRINT_VERSION or unversioned),
// the fingerprint of an entry's own output_items (a final-turn response),
// and either of those against the transcript's trailing block of
// model-authored items (a merged transcript). It returns the method and
// entry when exactly one token sequence matches, records abstentions in
// reasons, and returns an error only where Gym's code raises.
func contentWitness(entries []TokenEntry, output json.RawMessage, reasons *[]string) (string, *TokenEntry, error) {
	var out *pyValue
	if output != nil {
		out, _ = parsePy(output, false)
	}
	if out == nil || out.kind != pyList || len(out.list) == 0 {
		*reasons = append(*reasons, "response_has_no_output")
		return "", nil, nil
	}
	var items []*pyValue
	for _, it := range out.list {
		if it.kind == pyDict {
			items = append(items, it)
		}
	}
	target, err := assistantFingerprint(items)
	if errors.Is(err, errPyCrash) {
		return "", nil, err
	}
	if err != nil {
		*reasons = append(*reasons, "response_output_unfingerprintable")
		return "", nil, nil
	}
	if target == "" {
		*reasons = append(*reasons, "no_model_authored_output")
		return "", nil, nil
	}
	n := len(items)
	for n > 0 && isAssistantAuthored(items[n-1]) {
		n--
	}
	tail := ""
	if n > 0 && n < len(items) {
		tail, err = assistantFingerprint(items[n:])
		if errors.Is(err, errPyCrash) {
			return "", nil, err
		}
		if err != nil {
			tail = ""
		}
	}
	var order []string
	matches := map[string]*TokenEntry{}
	match := func(e *TokenEntry) {
		if _, ok := matches[e.ModelCallID]; !ok {
			order = append(order, e.ModelCallID)
		}
		matches[e.ModelCallID] = e
	}
	cumulativeHit := false
	for i := range entries {
		e := &entries[i]
		if c := e.ContinuationFingerprint; c != "" && c == target && (e.FingerprintVersion == nil || *e.FingerprintVersion == FingerprintVersion) {
			match(e)
			cumulativeHit = true
		}
		if len(e.OutputItems) == 0 {
			continue
		}
		own, err := entryFingerprint(e)
		if errors.Is(err, errPyCrash) {
			return "", nil, err
		}
		if err != nil {
			continue
		}
		if own != "" && (own == target || (tail != "" && own == tail)) {
			match(e)
		}
	}
	cands := make([]*TokenEntry, len(order))
	for i, id := range order {
		cands[i] = matches[id]
	}
	if winner := collapseIdentical(cands); winner != nil {
		if cumulativeHit {
			return "content_cumulative", winner, nil
		}
		return "content_output", winner, nil
	}
	if len(cands) > 0 {
		*reasons = append(*reasons, "content_ambiguous")
	} else {
		*reasons = append(*reasons, "no_content_match")
	}
	return "", nil, nil
}

// entryFingerprint is the fingerprint of an entry's own output_items, read
// as Gym reads a store line (orjson.loads).
func entryFingerprint(e *TokenEntry) (string, error) {
	items := make([]*pyValue, len(e.OutputItems))
	for i, raw := range e.OutputItems {
		v, err := parsePy(raw, true)
		if err != nil {
			return "", err
		}
		items[i] = v
	}
	return assistantFingerprint(items)
}
