package gym

import "strings"

// TerminalAttribution names the captured call whose response the verifier
// scored (spec §3.6), or records why none could be named.
type TerminalAttribution struct {
	CallID string // "" when unattributed
	Method string // "explicit", "declared" or "response_id"; "" when unattributed
	Reason string // abstentions, disagreements and corroborations, comma-separated
	// DeclaredMiss is set when a declared response id matched no entry or
	// several different ones: declarations are authoritative, so the
	// rollout must be masked.
	DeclaredMiss bool
}

// TerminalWitnesses are the terminal evidence a rollout record carries.
type TerminalWitnesses struct {
	ExplicitCallID     string // _ng_terminal_model_call_id (soft)
	DeclaredResponseID string // terminal_response_id (authoritative)
	ResponseID         string // response.id
	HaveResponse       bool   // the record has a response object
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

// ResolveTerminal joins the record's terminal evidence to one captured call.
// Witnesses that name the same call, or calls with identical full token
// sequences, corroborate; disagreement attributes nothing. It never fails.
// The content-fingerprint witness of Gym is not implemented: it abstains
// (see the package doc).
func ResolveTerminal(entries []TokenEntry, w TerminalWitnesses) TerminalAttribution {
	var reasons []string
	byID := make(map[string]*TokenEntry, len(entries))
	for i := range entries {
		if _, ok := byID[entries[i].ModelCallID]; !ok {
			byID[entries[i].ModelCallID] = &entries[i]
		}
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
		reasons = append(reasons, "content_witness_not_implemented")
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
		return TerminalAttribution{Reason: strings.Join(reasons, ",")}
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
