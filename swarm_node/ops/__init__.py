"""Operations: the command line, local swarms, bootstrap, doctor."""
