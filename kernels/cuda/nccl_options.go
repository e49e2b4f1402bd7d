package cuda

// NCCLIDBytes is the size of NCCL's unique id (NCCL_UNIQUE_ID_BYTES).
const NCCLIDBytes = 128

// NCCLOptions configure OpenNCCL.
type NCCLOptions struct {
	// Lib is the library to dlopen; "" means $TRACEGRPO_NCCL_LIB, else
	// libnccl.so.2 in $TRACEGRPO_CUDA_LIBS, $LD_LIBRARY_PATH, the nvidia-nccl
	// pip wheel's nvidia/nccl/lib of the Python installations found, and
	// the loader's default path.
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
