package gym

// Schema-1 captures: the records NeMo Gym's main writes today
// (TokenEntrySchemaV1) carry no request-time lineage, so Gym main's
// prefix_merging chains their calls by token prefixes alone, delivers one
// chain and masks the rollout unless the capture forms exactly one chain
// with every retry resolved (consumer.py's _assemble). PrefixMergingV1 is
// that builder; BuildTrainingTraces applies that verdict, so a schema-1
// rollout trains exactly the tokens Gym main's rebuilt response.output
// carries, or is masked where Gym main masks it.
//
// Sources, NVIDIA-NeMo/Gym main 07d6b0d07b22fcf530b4c211dae2ee23100428e4:
// nemo_gym/token_id_capture/builder.py (prefix_merging, _PrefixIndex),
// consumer.py (_assemble), records.py (TokenEntry schema 1).

import (
	"fmt"
	"math"
	"sort"
)

// ReasonMultipleChains: a schema-1 capture does not form exactly one chain
// (more than one root call, or a call with two continuations). Gym main's
// consumer masks it; without lineage a branch, a sub-agent and an
// unrecorded retry look alike.
const ReasonMultipleChains = "multiple_chains"

// PrefixMergingV1 is Gym main's prefix_merging over schema-1 entries: empty
// generations dropped; calls ordered by (prompt length, call id); each
// call's parent the earlier call whose prompt+generation is the longest
// prefix of its prompt (several identical candidates quarantine the call);
// retry siblings (one parent, one prompt) resolved by a non-quarantined
// continuation, else the smallest call id kept and all of them unresolved;
// one chain per leaf with no quarantined call on its path, "main" the one
// whose root has the earliest (created_at, call id). Byte-identical repeats
// of one call id are read once (the first copy).
func PrefixMergingV1(entries []TokenEntry) *BuildOutput {
	notes := BuildNotes{Builder: BuilderPrefixMerging, ParentLinkFailures: map[string]int{}}
	seen := make(map[string]bool, len(entries))
	var kept []*TokenEntry
	for i := range entries {
		e := &entries[i]
		if seen[e.ModelCallID] {
			continue
		}
		seen[e.ModelCallID] = true
		if len(e.GenerationTokenIDs) == 0 {
			notes.EmptyGenerationCalls = append(notes.EmptyGenerationCalls, e.ModelCallID)
			continue
		}
		kept = append(kept, e)
	}
	if len(kept) == 0 {
		return &BuildOutput{Notes: notes}
	}
	sort.SliceStable(kept, func(i, j int) bool {
		a, b := kept[i], kept[j]
		if len(a.PromptTokenIDs) != len(b.PromptTokenIDs) {
			return len(a.PromptTokenIDs) < len(b.PromptTokenIDs)
		}
		return a.ModelCallID < b.ModelCallID
	})
	trie := &prefixTrie{}
	nodes := make([]*buildNode, 0, len(kept))
	var quarantined []string
	roots := 0
	for _, e := range kept {
		n := &buildNode{entry: e, cumLen: len(e.PromptTokenIDs) + len(e.GenerationTokenIDs)}
		if parent, ambiguous := trie.infer(e.PromptTokenIDs); parent != nil {
			n.parent = parent
			if ambiguous {
				n.quarantined = true
				quarantined = append(quarantined, e.ModelCallID)
			}
			parent.children = append(parent.children, n)
		} else {
			roots++
		}
		nodes = append(nodes, n)
		trie.add(n)
	}
	// Retry siblings, groups (by parent, roots together) and prompts in
	// order of first appearance, as Gym's dicts iterate.
	for _, rg := range retrySets(nodes) {
		keep := map[*buildNode]bool{}
		for _, n := range rg {
			for _, c := range n.children {
				if !c.quarantined {
					keep[n] = true
					break
				}
			}
		}
		if len(keep) == 0 {
			keep[smallestCall(rg)] = true
			for _, n := range rg {
				notes.UnresolvedRetries = append(notes.UnresolvedRetries, n.entry.ModelCallID)
			}
		}
		for _, n := range rg {
			if !keep[n] && !n.quarantined {
				n.quarantined = true
				quarantined = append(quarantined, n.entry.ModelCallID)
			}
		}
	}
	var chains []Chain
	for _, leaf := range nodes {
		if len(leaf.children) > 0 {
			continue
		}
		var path []*buildNode
		skip := false
		for c := leaf; c != nil; c = c.parent {
			path = append(path, c)
			skip = skip || c.quarantined
		}
		if skip {
			continue
		}
		root := path[len(path)-1].entry
		ch := Chain{RootPrompt: root.PromptTokenIDs, Links: make([]ChainLink, 0, len(path))}
		prevCum := len(root.PromptTokenIDs)
		for i := len(path) - 1; i >= 0; i-- {
			n := path[i]
			var inter []int32
			if i < len(path)-1 {
				inter = n.entry.PromptTokenIDs[prevCum:]
			}
			ch.Links = append(ch.Links, ChainLink{Entry: n.entry, Interstitial: inter})
			prevCum = n.cumLen
		}
		chains = append(chains, ch)
	}
	captured, delivered := 0, 0
	for _, e := range kept {
		captured += len(e.GenerationTokenIDs)
	}
	if len(chains) > 0 {
		main := 0
		for i := range chains {
			a, b := chains[i].Links[0].Entry, chains[main].Links[0].Entry
			if a.CreatedAt < b.CreatedAt || (a.CreatedAt == b.CreatedAt && a.ModelCallID < b.ModelCallID) {
				main = i
			}
		}
		branch := 0
		for i := range chains {
			if i == main {
				chains[i].ChainID = "main"
				for _, l := range chains[i].Links {
					delivered += len(l.Entry.GenerationTokenIDs)
				}
			} else {
				chains[i].ChainID = fmt.Sprintf("branch-%d", branch)
				branch++
			}
		}
	}
	notes.Roots, notes.Chains = roots, len(chains)
	notes.GeneratedTokensCaptured, notes.GeneratedTokensDelivered = captured, delivered
	if captured > 0 {
		notes.DeliveredFraction = math.Round(float64(delivered)/float64(captured)*1e4) / 1e4
	}
	return &BuildOutput{Chains: chains, Quarantined: quarantined, Notes: notes}
}

// buildV1 builds a schema-1 snapshot: Gym main's prefix_merging and its
// consumer's verdict (one root, one chain, no unresolved retry), or under
// per_request one trace per call that admission keeps (retries resolved;
// several roots allowed, each call trained on its own full prompt).
func buildV1(snap *Snapshot, builder string, m *CaptureMetrics) (*TrainingTraceBatch, error) {
	out := PrefixMergingV1(snap.Entries)
	n := &out.Notes
	m.Chains, m.Roots = n.Chains, n.Roots
	m.QuarantinedCalls = len(out.Quarantined)
	m.QuarantinedFraction = math.Round(float64(len(out.Quarantined))/float64(len(snap.Entries))*1e4) / 1e4
	m.DeliveredFraction = n.DeliveredFraction
	m.GeneratedTokensCaptured, m.GeneratedTokensDelivered = n.GeneratedTokensCaptured, n.GeneratedTokensDelivered
	m.UnresolvedRetries = len(n.UnresolvedRetries)
	m.EmptyGenerationCalls = len(n.EmptyGenerationCalls)
	if len(out.Chains) == 0 {
		return nil, maskf(ReasonNoTrainableCalls, "the capture of rollout %s produced no safe trainable chain (schema 1: %d calls, %d quarantined, %d without generated tokens)",
			snap.RolloutID, len(snap.Entries), len(out.Quarantined), len(n.EmptyGenerationCalls))
	}
	if len(n.UnresolvedRetries) > 0 {
		return nil, maskf(ReasonUnresolvedCustody, "retries %v of rollout %s are unresolved: no later call continues one of them, so the generation the harness kept is unknown (schema 1)",
			n.UnresolvedRetries, snap.RolloutID)
	}
	if builder == BuilderPerRequest {
		var calls []*TokenEntry
		have := map[string]bool{}
		for _, ch := range out.Chains {
			for _, l := range ch.Links {
				if !have[l.Entry.ModelCallID] {
					have[l.Entry.ModelCallID] = true
					calls = append(calls, l.Entry)
				}
			}
		}
		sort.Slice(calls, func(i, j int) bool { return calls[i].ModelCallID < calls[j].ModelCallID })
		chains := make([]Chain, len(calls))
		delivered := 0
		for i, e := range calls {
			chains[i] = Chain{ChainID: e.ModelCallID, RootPrompt: e.PromptTokenIDs, Links: []ChainLink{{Entry: e}}}
			delivered += len(e.GenerationTokenIDs)
		}
		out.Chains, n.Builder, n.Chains = chains, BuilderPerRequest, len(chains)
		m.Chains = len(chains)
		m.GeneratedTokensDelivered = delivered
		if n.GeneratedTokensCaptured > 0 {
			m.DeliveredFraction = math.Round(float64(delivered)/float64(n.GeneratedTokensCaptured)*1e4) / 1e4
		}
	} else if n.Roots != 1 || n.Chains != 1 {
		return nil, maskf(ReasonMultipleChains, "the calls of rollout %s form %d root(s) and %d chain(s), not one chain; NeMo Gym main's records (schema 1) carry no lineage to tell a branch, a sub-agent and an unrecorded retry apart, so Gym masks it too (schema-3 captures train every trace)",
			snap.RolloutID, n.Roots, n.Chains)
	}
	env, err := ProjectTrainingTraces(snap.RolloutID, out)
	if err != nil {
		return nil, err
	}
	m.Traces = len(env.Traces)
	return env, nil
}
