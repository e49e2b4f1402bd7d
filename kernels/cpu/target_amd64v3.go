//go:build amd64.v3

package cpu

// goFusesAMD64: built with GOAMD64=v3 or later, the compiler fuses a·b+c
// into one FMA where the source allows it, which changes rounding.
const goFusesAMD64 = true
