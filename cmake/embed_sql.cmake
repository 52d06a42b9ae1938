# Turns sql/NNNN_name.sql files into a C++ source holding them in order, so that the binaries carry
# their migrations and never read SQL from disk at run time. Runs at build time (see sql/).
file(GLOB files "${SQL_DIR}/[0-9][0-9][0-9][0-9]_*.sql")
list(SORT files)
set(body "")
foreach(f IN LISTS files)
  get_filename_component(name "${f}" NAME)
  string(SUBSTRING "${name}" 0 4 version)
  math(EXPR version "${version}")
  file(READ "${f}" text)
  string(APPEND body "    {${version}, \"${name}\", R\"baton_sql(${text})baton_sql\"},\n")
endforeach()
file(WRITE "${OUT}.tmp"
"// Generated from sql/*.sql by cmake/embed_sql.cmake. Do not edit.\n"
"#include \"migrations_data.h\"\n\n"
"namespace baton::detail {\n\n"
"const std::vector<Migration>& embedded_migrations() {\n"
"  static const std::vector<Migration> all{\n${body}  };\n"
"  return all;\n}\n\n}  // namespace baton::detail\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
