// Package optim updates the model's flat parameter arena: AdamW with decoupled
// weight decay and bias correction (torch.optim.AdamW's order of operations),
// global gradient-norm clipping that reports the pre-clip norm, a guard against
// non-finite gradients, and the learning-rate / weight-decay schedules that
// NeMo RL recipes configure (spec docs/multitrace-grpo.md §7).
//
// # Arenas and groups
//
// Parameters, gradients and the two Adam moments are each one fp32 buffer of
// the same length N; the moments live in one arena of 2N elements (m then v).
// A parameter group is a range [Off, Off+N) of the arena with a flag saying
// whether weight decay applies (the model's parameter table decides; this
// package never imports model). Groups are sorted, disjoint and need not cover
// the arena; elements outside every group are neither clipped-over nor updated.
//
// # One update
//
// AdamW.Step computes Σg² per group with the backend's SumSquares (one small
// download), the global norm ‖g‖ = sqrt(Σ over groups) in float64, the clip
// factor min(1, max_grad_norm/(‖g‖+1e-6)) exactly as torch's clip_grad_norm_
// does, and then runs one AdamW op per run of adjacent groups with the same
// decay flag, passing the clip factor as GradScale: the gradient arena is
// never rewritten. A non-finite norm skips the update (counted in
// State.Skipped) or aborts, as configured; a skipped update does not advance
// the step counter that bias correction uses.
//
// # Schedules
//
// Megatron reproduces Megatron-Core's OptimizerParamScheduler as
// Megatron-Bridge configures it: its clock counts samples, one iteration is
// train_global_batch_size samples, and Step(n) advances by n logical rollouts
// (spec §7.2: scheduler_step_samples, never the physical row count).
// Sequential reproduces NeMo RL's non-Megatron form, torch's SequentialLR over
// LinearLR/ConstantLR phases, whose clock counts Step calls. Both report the
// learning rate to use for the next update before Step is called, as the
// trainers read get_lr before scheduler.step.
package optim
