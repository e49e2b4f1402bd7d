package cuda

import "fmt"

// NCCLIDBytes is the size of NCCL's unique id (NCCL_UNIQUE_ID_BYTES).
const NCCLIDBytes = 128

// NCCLOptions configure OpenNCCL.
type NCCLOptions struct {
	// Lib is the library to dlopen; "" means $TRACEGRPO_NCCL_LIB, else
	// the first libnccl.so.2 libsearch.go's search finds that loads
	// ($TRACEGRPO_CUDA_LIBS, $LD_LIBRARY_PATH, the nvidia-nccl pip wheels'
	// nvidia/nccl/lib under any Python environment, the system's ld paths,
	// the loader's own search).
	Lib        string
	Rank, Size int
	// CommID is NCCL's own bootstrap address, host:port (its NCCL_COMM_ID):
	// every rank then derives the same unique id and rank 0 listens there.
	// When empty, ShareID must share rank 0's id with the other ranks.
	CommID string
	// ShareID, when CommID is empty, gives every rank rank 0's id (an MPI
	// broadcast under mpirun): id holds rank 0's on rank 0.
	ShareID func(id []byte) ([]byte, error)
}

// ncclVersionString renders ncclGetVersion's code: major·10000 + minor·100
// + patch since NCCL 2.9, major·1000 + minor·100 + patch before.
func ncclVersionString(v int) string {
	if v >= 20900 {
		return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100)
	}
	return fmt.Sprintf("%d.%d.%d", v/1000, v/100%10, v%100)
}
