package cpu

// float64 op-level wrappers around the generic kernels (the instantiation the
// finite-difference tests check) and naive independent forwards.

import "math"

func rmsnorm64(inp, w []float64, N, C int, eps float64) (out, rstd []float64) {
	out, rstd = make([]float64, N*C), make([]float64, N)
	rmsnormRows(out, rstd, inp, w, 0, N, C, eps)
	return
}

func rmsnormBwd64(dout, inp, w, rstd []float64, N, C int) (dinp, dw []float64) {
	dinp, dw = make([]float64, N*C), make([]float64, C)
	rmsnormBackwardRows(dinp, dw, dout, inp, w, rstd, 0, N, C, false)
	return
}

func matmul64(inp, w []float64, T, C, OC int) []float64 {
	out := make([]float64, T*OC)
	gemmRef(false, true, T, OC, C, inp, C, w, C, out, OC, false)
	return out
}

func matmulBwd64(dout, inp, w []float64, T, C, OC int) (dinp, dw []float64) {
	dinp, dw = make([]float64, T*C), make([]float64, OC*C)
	gemmRef(false, false, T, C, OC, dout, OC, w, C, dinp, C, true)
	gemmRef(true, false, OC, C, T, dout, OC, inp, C, dw, C, true)
	return
}

func rope64(x []float64, pos []int32, T, H, HD int, theta float32, inverse bool) []float64 {
	P := 0
	for _, p := range pos {
		P = max(P, int(p)+1)
	}
	c, s := make([]float64, P*HD/2), make([]float64, P*HD/2)
	ropeTableHF(c, s, P, HD, theta)
	y := append([]float64(nil), x...)
	ropeRows(y, pos, 0, T, H, HD, c, s, inverse)
	return y
}

// ropeTableHF fills cos/sin tables (P, HD/2) for positions [0, P) with
// inv_freq[i] = theta^(−2i/HD). The float32 instantiation follows Hugging
// Face's float32 arithmetic (inv_freq = 1/theta^(float32(2i)/HD) in float32,
// angle = float32(p)·inv_freq rounded to float32, then cos/sin of that), as
// package model does for the backend's tables; the float64 one is exact.
func ropeTableHF[F Float](cosT, sinT []F, P, HD int, theta float32) {
	half := HD / 2
	for i := 0; i < half; i++ {
		var inv float64
		if isF32[F]() {
			e := float32(2*i) / float32(HD)
			inv = float64(float32(1) / float32(math.Pow(float64(theta), float64(e))))
		} else {
			inv = 1 / math.Pow(float64(theta), float64(2*i)/float64(HD))
		}
		for p := 0; p < P; p++ {
			a := float64(p) * inv
			if isF32[F]() {
				a = float64(float32(float32(p) * float32(inv)))
			}
			cosT[p*half+i] = F(math.Cos(a))
			sinT[p*half+i] = F(math.Sin(a))
		}
	}
}

func attn64(q, k, v []float64, lens []int, NH, NKV, HD int) (out, lse []float64) {
	T := sum(lens)
	cu := cuOf(lens)
	out, lse = make([]float64, T*NH*HD), make([]float64, T*NH)
	sc := make([]float64, T)
	for t := 0; t < T; t++ {
		s0 := int(cu[seqOf(cu, t)])
		for h := 0; h < NH; h++ {
			attnForwardRow(out, lse, q, k, v, t, h, s0, NH, NKV, HD, sc)
		}
	}
	return
}

func attnBwd64(dout, out, lse, q, k, v []float64, lens []int, NH, NKV, HD int) (dq, dk, dv []float64) {
	T := sum(lens)
	cu := cuOf(lens)
	dq, dk, dv = make([]float64, T*NH*HD), make([]float64, T*NKV*HD), make([]float64, T*NKV*HD)
	for s := range lens {
		for kvh := 0; kvh < NKV; kvh++ {
			attnBackwardGroup(dq, dk, dv, dout, out, lse, q, k, v, int(cu[s]), int(cu[s+1]), kvh, NH, NKV, HD)
		}
	}
	return
}

// attnNaive64 is an independent forward: per sequence and head, the full
// score matrix with a causal mask and a textbook softmax.
func attnNaive64(q, k, v []float64, lens []int, NH, NKV, HD int) (out, lse []float64) {
	T := sum(lens)
	out, lse = make([]float64, T*NH*HD), make([]float64, T*NH)
	base := 0
	for _, L := range lens {
		for h := 0; h < NH; h++ {
			kvh := h * NKV / NH
			for i := 0; i < L; i++ {
				ti := base + i
				w := make([]float64, L)
				for j := 0; j < L; j++ {
					if j > i {
						w[j] = math.Inf(-1)
						continue
					}
					tj := base + j
					w[j] = dot64(q[(ti*NH+h)*HD:(ti*NH+h+1)*HD], k[(tj*NKV+kvh)*HD:(tj*NKV+kvh+1)*HD]) / math.Sqrt(float64(HD))
				}
				var z float64
				for _, x := range w {
					z += math.Exp(x)
				}
				lse[ti*NH+h] = math.Log(z)
				for j := 0; j <= i; j++ {
					p := math.Exp(w[j]) / z
					tj := base + j
					for d := 0; d < HD; d++ {
						out[(ti*NH+h)*HD+d] += p * v[(tj*NKV+kvh)*HD+d]
					}
				}
			}
		}
		base += L
	}
	return
}

func swiglu64(gate, up []float64) []float64 {
	out := make([]float64, len(gate))
	swigluRange(out, gate, up)
	return out
}

func swigluBwd64(dout, gate, up []float64) (dgate, dup []float64) {
	dgate, dup = make([]float64, len(gate)), make([]float64, len(gate))
	swigluBackwardRange(dgate, dup, dout, gate, up)
	return
}

func tlp64(hidden, w []float64, targets []int32, T, C, V int, invTemp float64) (lp, ent, lse []float64) {
	lp, ent, lse = make([]float64, T), make([]float64, T), make([]float64, T)
	tokenLogprobRows(nil, lp, ent, lse, hidden, w, targets, 0, T, C, V, invTemp)
	return
}

// tlpBwd64 runs the backward in vocabulary chunks of vchunk, as the Backend
// does, serially.
func tlpBwd64(dlp, hidden, w, lse []float64, targets []int32, T, C, V int, invTemp float64, vchunk int) (dh, dw []float64) {
	dh, dw = make([]float64, T*C), make([]float64, V*C)
	for v0 := 0; v0 < V; v0 += vchunk {
		vc := min(vchunk, V-v0)
		dz := make([]float64, T*vc)
		tokenLogprobBackwardRows(nil, dz, dh, hidden, w, dlp, lse, targets, 0, T, v0, vc, C, V, invTemp)
		gemmRef(true, false, vc, C, T, dz, vc, hidden, C, dw[v0*C:], C, true)
	}
	return
}

// tlpNaive64 is an independent forward: full logits, textbook log-softmax.
func tlpNaive64(hidden, w []float64, targets []int32, T, C, V int, invTemp float64) (lp, ent, lse []float64) {
	lp, ent, lse = make([]float64, T), make([]float64, T), make([]float64, T)
	for t := 0; t < T; t++ {
		if targets[t] < 0 {
			continue
		}
		z := make([]float64, V)
		m := math.Inf(-1)
		for v := range z {
			z[v] = dot64(hidden[t*C:(t+1)*C], w[v*C:(v+1)*C]) * invTemp
			m = max(m, z[v])
		}
		var s float64
		for _, x := range z {
			s += math.Exp(x - m)
		}
		l := m + math.Log(s)
		lse[t] = l
		lp[t] = z[targets[t]] - l
		for _, x := range z {
			p := math.Exp(x - l)
			ent[t] -= p * (x - l)
		}
	}
	return
}
