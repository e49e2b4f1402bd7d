package gym

import (
	"fmt"
	"math"
	"sort"
	"unsafe"
)

// ChainLink is one call on a chain. Interstitial holds the prompt tokens the
// call added after its parent's cumulative tokens (environment, tool or user
// tokens; never trained). It is empty for the first link.
type ChainLink struct {
	Entry        *TokenEntry
	Interstitial []int32
}

// Chain is a root-to-node path of calls in which each child's prompt is a
// verified continuation of its parent's prompt and generation.
type Chain struct {
	ChainID    string
	Links      []ChainLink
	RootPrompt []int32
}

// Terminal chain states of BuildNotes.TerminalChain.
const (
	TerminalNone        = ""
	TerminalDelivered   = "delivered"
	TerminalBroken      = "broken"
	TerminalNotCaptured = "not_captured"
)

// BuildNotes says what a build kept, dropped or could not resolve (spec §3).
type BuildNotes struct {
	Builder                  string
	Roots                    int
	Chains                   int
	GeneratedTokensCaptured  int
	GeneratedTokensDelivered int
	DeliveredFraction        float64
	UnresolvedRetries        []string
	TerminalCallID           string
	TerminalChain            string
	EmptyGenerationCalls     []string
	ParentLinkFailures       map[string]int
	UnresolvedParentCalls    []string
}

// BuildOutput is a builder's result: the chains, the quarantined call ids
// (abandoned retries) and the notes.
type BuildOutput struct {
	Chains      []Chain
	Quarantined []string
	Notes       BuildNotes
}

// maxDeltaDepth bounds a delta prompt's walk to its full-prompt ancestor.
const maxDeltaDepth = 10000

type buildNode struct {
	entry              *TokenEntry
	parent             *buildNode
	children           []*buildNode
	quarantined        bool
	unresolvedBoundary bool
	cumLen             int
}

// tokensKey views a token slice as a string for map keys (no copy; the slice
// must not change while the key is in use).
func tokensKey(t []int32) string {
	if len(t) == 0 {
		return ""
	}
	return unsafe.String((*byte)(unsafe.Pointer(&t[0])), len(t)*4)
}

func tokensEqual(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// prefixTrie indexes the cumulative sequences of added nodes for
// missing-parent recovery.
type prefixTrie struct {
	children   map[int32]*prefixTrie
	candidates []*buildNode
}

func (t *prefixTrie) add(n *buildNode) {
	cur := t
	for _, part := range [2][]int32{n.entry.PromptTokenIDs, n.entry.GenerationTokenIDs} {
		for _, tok := range part {
			next := cur.children[tok]
			if next == nil {
				if cur.children == nil {
					cur.children = map[int32]*prefixTrie{}
				}
				next = &prefixTrie{}
				cur.children[tok] = next
			}
			cur = next
		}
	}
	cur.candidates = append(cur.candidates, n)
}

// infer returns the deepest added node whose cumulative sequence is a prefix
// of prompt, and whether several nodes share that sequence.
func (t *prefixTrie) infer(prompt []int32) (*buildNode, bool) {
	var best []*buildNode
	cur := t
	for _, tok := range prompt {
		next := cur.children[tok]
		if next == nil {
			break
		}
		cur = next
		if len(cur.candidates) > 0 {
			best = cur.candidates
		}
	}
	if len(best) == 0 {
		return nil, false
	}
	return best[0], len(best) > 1
}

// Parent-link notes counted in BuildNotes.ParentLinkFailures.
const (
	noteParentUnresolved     = "parent_unresolved"
	noteResolvedMissingID    = "resolved_parent_missing_id"
	noteParentMissing        = "parent_call_id_missing"
	noteParentMissingRecover = "parent_call_id_missing_recovered"
	noteDigestMismatch       = "parent_digest_mismatch"
	noteMissingResolution    = "missing_resolution"
	noteDuplicateConflict    = "duplicate_call_id_conflict"
	noteDeltaUnreconstruct   = "delta_chain_unreconstructable"
)

func resolveParent(n *buildNode, byID map[string]*buildNode, trie *prefixTrie, verifiedProofs bool) (*buildNode, bool, string) {
	e := n.entry
	prompt := e.PromptTokenIDs
	if e.ParentResolution != nil {
		switch *e.ParentResolution {
		case ParentRoot:
			return nil, false, ""
		case ParentUnresolved:
			return nil, false, noteParentUnresolved
		}
	}
	claimed := e.ParentCallID
	if (e.ParentResolution != nil && *e.ParentResolution == ParentResolved) || claimed != nil {
		if claimed == nil {
			return nil, false, noteResolvedMissingID
		}
		parent := byID[*claimed]
		if parent == nil {
			if trie != nil {
				if inferred, ambiguous := trie.infer(prompt); inferred != nil && !ambiguous {
					return inferred, false, noteParentMissingRecover
				}
			}
			return nil, false, noteParentMissing
		}
		pe := parent.entry
		cumLen := len(pe.PromptTokenIDs) + len(pe.GenerationTokenIDs)
		if pe.CumLen != nil {
			cumLen = *pe.CumLen
		}
		if cumLen < 0 || cumLen > len(prompt) {
			return nil, false, noteDigestMismatch
		}
		// Gym compares digest(prompt[:cum_len]) with the parent's digest, or
		// with digest(parent cumulative) when the parent has none.
		noDigest := pe.Digest == nil || *pe.Digest == ""
		if verifiedProofs || noDigest {
			// Equal digests of the parent's own (verified) tokens are equal
			// tokens, so compare tokens instead of hashing.
			if cumLen == len(pe.PromptTokenIDs)+len(pe.GenerationTokenIDs) &&
				tokensEqual(prompt[:len(pe.PromptTokenIDs)], pe.PromptTokenIDs) &&
				tokensEqual(prompt[len(pe.PromptTokenIDs):cumLen], pe.GenerationTokenIDs) {
				return parent, false, ""
			}
			return nil, false, noteDigestMismatch
		}
		if d, ok := computeDigest(prompt[:cumLen]); ok && d == *pe.Digest {
			return parent, false, ""
		}
		return nil, false, noteDigestMismatch
	}
	return nil, false, noteMissingResolution
}

// materializeDeltas rebuilds the full prompt of every prompt_is_delta entry
// by walking parent_call_id to a full-prompt ancestor. It returns the
// full-prompt entries (copies where rebuilt) and the broken delta ids.
func materializeDeltas(entries []*TokenEntry) ([]*TokenEntry, []string) {
	anyDelta := false
	for _, e := range entries {
		if e.PromptIsDelta {
			anyDelta = true
			break
		}
	}
	if !anyDelta {
		return entries, nil
	}
	byID := make(map[string]*TokenEntry, len(entries))
	for _, e := range entries {
		byID[e.ModelCallID] = e
	}
	type cumState struct {
		tokens []int32
		ok     bool
	}
	memo := map[string]cumState{}
	cumOf := func(id string) ([]int32, bool) {
		if st, ok := memo[id]; ok {
			return st.tokens, st.ok
		}
		var path []*TokenEntry
		seen := map[string]bool{}
		cur := id
		var base []int32
		baseOK := false
		for {
			if st, ok := memo[cur]; ok {
				base, baseOK = st.tokens, st.ok
				break
			}
			if seen[cur] || len(path) > maxDeltaDepth {
				memo[cur] = cumState{}
				break
			}
			seen[cur] = true
			e := byID[cur]
			if e == nil {
				memo[cur] = cumState{}
				break
			}
			if !e.PromptIsDelta {
				base, baseOK = e.Cumulative(), true
				memo[cur] = cumState{base, true}
				break
			}
			path = append(path, e)
			if e.ParentCallID == nil {
				memo[cur] = cumState{}
				break
			}
			cur = *e.ParentCallID
		}
		if !baseOK {
			for _, e := range path {
				memo[e.ModelCallID] = cumState{}
			}
			return nil, false
		}
		v := base
		for i := len(path) - 1; i >= 0; i-- {
			e := path[i]
			nv := make([]int32, 0, len(v)+len(e.PromptTokenIDs)+len(e.GenerationTokenIDs))
			nv = append(append(append(nv, v...), e.PromptTokenIDs...), e.GenerationTokenIDs...)
			v = nv
			memo[e.ModelCallID] = cumState{v, true}
		}
		st := memo[id]
		return st.tokens, st.ok
	}
	out := make([]*TokenEntry, 0, len(entries))
	var broken []string
	for _, e := range entries {
		if !e.PromptIsDelta {
			out = append(out, e)
			continue
		}
		cum, ok := cumOf(e.ModelCallID)
		if !ok {
			broken = append(broken, e.ModelCallID)
			continue
		}
		rebuilt := *e
		rebuilt.PromptTokenIDs = append([]int32(nil), cum[:len(cum)-len(e.GenerationTokenIDs)]...)
		rebuilt.PromptIsDelta = false
		if e.Digest != nil && *e.Digest != "" {
			if d, ok := computeDigest(cum); !ok || d != *e.Digest {
				broken = append(broken, e.ModelCallID)
				continue
			}
		}
		out = append(out, &rebuilt)
	}
	return out, broken
}

// PrefixMerging is Gym's prefix_merging builder (spec §3.1). With allTraces
// it applies the all_traces rules: full-record duplicate comparison, the
// cumulative proofs, the rewritten-full-prompt root rule, extended-sibling
// retention and no terminal truncation. The only error is a proof mismatch
// (a *MaskError): the rollout is masked.
func PrefixMerging(entries []TokenEntry, terminalCallID string, allTraces bool) (*BuildOutput, error) {
	// 1. De-duplicate by model_call_id; the first copy wins.
	deduped := make([]*TokenEntry, 0, len(entries))
	first := make(map[string]*TokenEntry, len(entries))
	var conflicts []string
	for i := range entries {
		c := &entries[i]
		prev, ok := first[c.ModelCallID]
		if !ok {
			first[c.ModelCallID] = c
			deduped = append(deduped, c)
			continue
		}
		if allTraces {
			if !sameRecordExceptCreatedAt(prev, c) {
				conflicts = append(conflicts, c.ModelCallID)
			}
		} else if !tokensEqual(prev.PromptTokenIDs, c.PromptTokenIDs) || !tokensEqual(prev.GenerationTokenIDs, c.GenerationTokenIDs) {
			conflicts = append(conflicts, c.ModelCallID)
		}
	}
	capturedFull := make(map[string]bool, len(deduped))
	for _, e := range deduped {
		if !e.PromptIsDelta {
			capturedFull[e.ModelCallID] = true
		}
	}
	// 3. Delta prompts.
	full, unreconstructable := materializeDeltas(deduped)
	// 4. Cumulative proofs (all_traces).
	if allTraces {
		for _, e := range full {
			n := len(e.PromptTokenIDs) + len(e.GenerationTokenIDs)
			if e.CumLen != nil && *e.CumLen != n {
				return nil, maskf(ReasonProofMismatch, "captured cumulative proof mismatch for %s: cum_len %d, tokens %d",
					e.ModelCallID, *e.CumLen, n)
			}
			if e.Digest != nil {
				if d, ok := digestOfConcat(e.PromptTokenIDs, e.GenerationTokenIDs); !ok || d != *e.Digest {
					return nil, maskf(ReasonProofMismatch, "captured cumulative proof mismatch for %s: digest", e.ModelCallID)
				}
			}
		}
	}
	failures := map[string]int{}
	var unresolvedParents []string
	for _, id := range conflicts {
		failures[noteDuplicateConflict]++
		unresolvedParents = append(unresolvedParents, id)
	}
	for _, id := range unreconstructable {
		failures[noteDeltaUnreconstruct]++
		unresolvedParents = append(unresolvedParents, id)
	}
	// 5. Empty generations.
	var emptyGen []string
	kept := full[:0:0]
	for _, e := range full {
		if len(e.GenerationTokenIDs) == 0 {
			emptyGen = append(emptyGen, e.ModelCallID)
		} else {
			kept = append(kept, e)
		}
	}
	notes := BuildNotes{Builder: BuilderPrefixMerging, TerminalCallID: terminalCallID,
		EmptyGenerationCalls: emptyGen, ParentLinkFailures: failures, UnresolvedParentCalls: unresolvedParents}
	if len(kept) == 0 {
		if terminalCallID != "" {
			notes.TerminalChain = TerminalNotCaptured
		}
		return &BuildOutput{Notes: notes}, nil
	}
	// 6. Order by (prompt length, call id).
	sort.Slice(kept, func(i, j int) bool {
		a, b := kept[i], kept[j]
		if len(a.PromptTokenIDs) != len(b.PromptTokenIDs) {
			return len(a.PromptTokenIDs) < len(b.PromptTokenIDs)
		}
		return a.ModelCallID < b.ModelCallID
	})
	surviving := make(map[string]bool, len(kept))
	for _, e := range kept {
		surviving[e.ModelCallID] = true
	}
	var trie *prefixTrie
	for _, e := range kept {
		if e.ParentCallID != nil && !surviving[*e.ParentCallID] {
			trie = &prefixTrie{}
			break
		}
	}
	// 7. Parent resolution.
	nodes := make([]*buildNode, 0, len(kept))
	byID := make(map[string]*buildNode, len(kept))
	var roots []*buildNode
	var quarantined []string
	for _, e := range kept {
		n := &buildNode{entry: e, cumLen: len(e.PromptTokenIDs) + len(e.GenerationTokenIDs)}
		parent, ambiguous, note := resolveParent(n, byID, trie, allTraces)
		if note != "" {
			failures[note]++
			rewritten := allTraces && note == noteDigestMismatch && e.ParentResolution != nil &&
				*e.ParentResolution == ParentResolved && capturedFull[e.ModelCallID] && e.CumLen != nil && e.Digest != nil
			if !hasSuffix(note, "_recovered") && !rewritten {
				n.unresolvedBoundary = true
				unresolvedParents = append(unresolvedParents, e.ModelCallID)
			}
		}
		if parent != nil {
			n.parent = parent
			if ambiguous {
				n.quarantined = true
				quarantined = append(quarantined, e.ModelCallID)
			}
			parent.children = append(parent.children, n)
		} else {
			roots = append(roots, n)
		}
		nodes = append(nodes, n)
		if trie != nil {
			trie.add(n)
		}
		byID[e.ModelCallID] = n
	}
	// 8. Terminal ancestry.
	var terminal *buildNode
	if terminalCallID != "" {
		terminal = byID[terminalCallID]
	}
	onTerminalPath := map[*buildNode]bool{}
	for a := terminal; a != nil; a = a.parent {
		onTerminalPath[a] = true
	}
	// 9. Retry resolution, groups in order of first appearance.
	var unresolvedRetries []string
	for _, rg := range retrySets(nodes) {
		keep := map[*buildNode]bool{}
		var onPath, extended []*buildNode
		for _, n := range rg {
			if onTerminalPath[n] {
				onPath = append(onPath, n)
			}
			for _, c := range n.children {
				if !c.quarantined {
					extended = append(extended, n)
					break
				}
			}
		}
		switch {
		case len(onPath) > 0:
			for _, n := range onPath {
				keep[n] = true
			}
			if allTraces {
				for _, n := range extended {
					keep[n] = true
				}
			}
		case len(extended) > 0:
			for _, n := range extended {
				keep[n] = true
			}
		default:
			keep[smallestCall(rg)] = true
			if terminal == nil || allTraces {
				for _, n := range rg {
					unresolvedRetries = append(unresolvedRetries, n.entry.ModelCallID)
				}
			}
		}
		for _, n := range rg {
			if !keep[n] && !n.quarantined {
				n.quarantined = true
				quarantined = append(quarantined, n.entry.ModelCallID)
			}
		}
	}
	// 10-11. Chains and terminal status.
	pathTo := func(n *buildNode) []*buildNode {
		var rev []*buildNode
		for c := n; c != nil; c = c.parent {
			rev = append(rev, c)
		}
		for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
			rev[i], rev[j] = rev[j], rev[i]
		}
		return rev
	}
	chainFrom := func(path []*buildNode) Chain {
		root := path[0].entry
		ch := Chain{RootPrompt: root.PromptTokenIDs, Links: make([]ChainLink, 0, len(path))}
		prevCum := len(root.PromptTokenIDs)
		for i, n := range path {
			var inter []int32
			if i > 0 {
				inter = n.entry.PromptTokenIDs[prevCum:]
			}
			ch.Links = append(ch.Links, ChainLink{Entry: n.entry, Interstitial: inter})
			prevCum = n.cumLen
		}
		return ch
	}
	var terminalChain *Chain
	if terminalCallID != "" {
		if terminal == nil {
			notes.TerminalChain = TerminalNotCaptured
		} else {
			tp := pathTo(terminal)
			broken := false
			for _, n := range tp {
				if n.quarantined || n.unresolvedBoundary {
					broken = true
					break
				}
			}
			if broken {
				notes.TerminalChain = TerminalBroken
			} else {
				ch := chainFrom(tp)
				terminalChain = &ch
				notes.TerminalChain = TerminalDelivered
			}
		}
	}
	if allTraces {
		terminalChain = nil
	}
	var chains []Chain
	for _, leaf := range nodes {
		if len(leaf.children) > 0 {
			continue
		}
		path := pathTo(leaf)
		skip := false
		for _, n := range path {
			if n.quarantined || (terminalChain != nil && n == terminal) {
				skip = true
				break
			}
		}
		if !skip {
			chains = append(chains, chainFrom(path))
		}
	}
	if terminalChain != nil {
		chains = append([]Chain{*terminalChain}, chains...)
	}
	if len(chains) > 0 {
		main := 0
		if terminalChain == nil {
			for i := range chains {
				a, b := chains[i].Links[0].Entry, chains[main].Links[0].Entry
				if a.CreatedAt < b.CreatedAt || (a.CreatedAt == b.CreatedAt && a.ModelCallID < b.ModelCallID) {
					main = i
				}
			}
		}
		branch := 0
		for i := range chains {
			if i == main {
				chains[i].ChainID = "main"
			} else {
				chains[i].ChainID = fmt.Sprintf("branch-%d", branch)
				branch++
			}
		}
	}
	captured := 0
	for _, e := range kept {
		captured += len(e.GenerationTokenIDs)
	}
	delivered := 0
	if allTraces {
		seen := map[string]bool{}
		for _, ch := range chains {
			for _, l := range ch.Links {
				if !seen[l.Entry.ModelCallID] {
					seen[l.Entry.ModelCallID] = true
					delivered += len(l.Entry.GenerationTokenIDs)
				}
			}
		}
	} else {
		for _, ch := range chains {
			if ch.ChainID == "main" {
				for _, l := range ch.Links {
					delivered += len(l.Entry.GenerationTokenIDs)
				}
			}
		}
	}
	notes.Roots = len(roots)
	notes.Chains = len(chains)
	notes.GeneratedTokensCaptured = captured
	notes.GeneratedTokensDelivered = delivered
	if captured > 0 {
		notes.DeliveredFraction = math.Round(float64(delivered)/float64(captured)*1e4) / 1e4
	}
	notes.UnresolvedRetries = unresolvedRetries
	notes.UnresolvedParentCalls = unresolvedParents
	return &BuildOutput{Chains: chains, Quarantined: quarantined, Notes: notes}, nil
}

func hasSuffix(s, suf string) bool { return len(s) >= len(suf) && s[len(s)-len(suf):] == suf }

// PerRequest is Gym's per_request builder (spec §3.2): prefix_merging's
// all_traces admission, then one full-prompt chain per retained call, sorted
// by call id.
func PerRequest(entries []TokenEntry, terminalCallID string) (*BuildOutput, error) {
	out, err := PrefixMerging(entries, terminalCallID, true)
	if err != nil {
		return nil, err
	}
	kept := map[string]*TokenEntry{}
	for _, ch := range out.Chains {
		for _, l := range ch.Links {
			kept[l.Entry.ModelCallID] = l.Entry
		}
	}
	ids := make([]string, 0, len(kept))
	for id := range kept {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	chains := make([]Chain, len(ids))
	for i, id := range ids {
		e := kept[id]
		chains[i] = Chain{ChainID: id, RootPrompt: e.PromptTokenIDs, Links: []ChainLink{{Entry: e}}}
	}
	out.Chains = chains
	out.Notes.Builder = BuilderPerRequest
	out.Notes.Chains = len(chains)
	return out, nil
}

// Build runs the named builder with all_traces semantics.
func Build(builder string, entries []TokenEntry, terminalCallID string) (*BuildOutput, error) {
	switch builder {
	case BuilderPrefixMerging:
		return PrefixMerging(entries, terminalCallID, true)
	case BuilderPerRequest:
		return PerRequest(entries, terminalCallID)
	}
	return nil, fmt.Errorf("gym: unknown builder %q; known: [%s %s]", builder, BuilderPerRequest, BuilderPrefixMerging)
}

// retrySets returns the sets of retries among nodes: siblings (the roots
// are siblings too) with the same prompt, two or more, in order of first
// appearance of their parent and then of their prompt, as Gym's dicts
// iterate. Both builders resolve retries over these sets.
func retrySets(nodes []*buildNode) [][]*buildNode {
	type key struct {
		parent *buildNode
		prompt string
	}
	index := map[key]int{}
	byParent := map[*buildNode][]int{} // a parent's sets, in order
	var parents []*buildNode           // parents in order of first appearance
	var sets [][]*buildNode
	for _, n := range nodes {
		k := key{n.parent, tokensKey(n.entry.PromptTokenIDs)}
		si, ok := index[k]
		if !ok {
			if _, seen := byParent[n.parent]; !seen {
				parents = append(parents, n.parent)
			}
			si = len(sets)
			index[k] = si
			byParent[n.parent] = append(byParent[n.parent], si)
			sets = append(sets, nil)
		}
		sets[si] = append(sets[si], n)
	}
	var out [][]*buildNode
	for _, p := range parents {
		for _, si := range byParent[p] {
			if len(sets[si]) >= 2 {
				out = append(out, sets[si])
			}
		}
	}
	return out
}

// smallestCall returns the node of set with the smallest model call id.
func smallestCall(set []*buildNode) *buildNode {
	smallest := set[0]
	for _, n := range set[1:] {
		if n.entry.ModelCallID < smallest.entry.ModelCallID {
			smallest = n
		}
	}
	return smallest
}
