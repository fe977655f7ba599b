"""What Spark reads for a run: files and tables (read and refused in one line before Spark where it
can), and the input's fingerprint that lets a resume skip its check."""
