//go:build !amd64.v3

package cpu

// goFusesAMD64: below GOAMD64=v3 the amd64 compiler rounds every product
// and sum (see target_amd64v3.go).
const goFusesAMD64 = false
