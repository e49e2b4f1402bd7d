package gym

// EnvelopeSchemaVersion is the only training_traces schema version there is.
const EnvelopeSchemaVersion = 1

// The builders a training_traces envelope may name.
const (
	BuilderPrefixMerging = "prefix_merging"
	BuilderPerRequest    = "per_request"
)

// TrainingTraceBatch is the training_traces v1 envelope that Gym attaches to a
// finished rollout record (spec §2.5). Unknown fields are forbidden.
type TrainingTraceBatch struct {
	SchemaVersion int             `json:"schema_version"`
	RolloutID     string          `json:"rollout_id"`
	Builder       string          `json:"builder"`
	Traces        []TrainingTrace `json:"traces"`
}

// TrainingTrace is one independently conditioned token sequence of a rollout.
// TokenIDs, GenerationLogprobs and LossMask are aligned position by position;
// LossMask is 1 exactly on the owned sampled spans and 0 at position 0.
type TrainingTrace struct {
	TraceID            string        `json:"trace_id"`
	ModelCallIDs       []string      `json:"model_call_ids"`
	TokenIDs           []int32       `json:"token_ids"`
	GenerationLogprobs []float64     `json:"generation_logprobs"`
	LossMask           []int8        `json:"loss_mask"`
	SampledSpans       []SampledSpan `json:"sampled_spans"`
}

// SampledSpan is the half-open range [Start, End) of trace positions that holds
// one model call's generated tokens and receives its loss.
type SampledSpan struct {
	ModelCallID string `json:"model_call_id"`
	Start       int    `json:"start"`
	End         int    `json:"end"`
}
