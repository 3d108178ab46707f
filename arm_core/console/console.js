// The operator console (issue 11).
