/* Whether an ELF file carries DWARF line info (a .debug_line section), read from its section
 * headers without libdw: the symbolizer tests expect file:line where it is there and
 * "func (module+0x..)" where it is not (a release build, a stripped copy). */
#ifndef MT_TESTS_CALLSITE_DWARF_H
#define MT_TESTS_CALLSITE_DWARF_H

#include <elf.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline bool mt_test_has_line_info(const char *path)
{
    bool found = false;
    Elf64_Ehdr eh;
    Elf64_Shdr *sh = NULL;
    char *names = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return false;
    if (fread(&eh, sizeof eh, 1, f) != 1 || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
        eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof *sh ||
        eh.e_shstrndx >= eh.e_shnum)
        goto done;
    sh = calloc(eh.e_shnum, sizeof *sh);
    if (sh == NULL || fseek(f, (long)eh.e_shoff, SEEK_SET) != 0 ||
        fread(sh, sizeof *sh, eh.e_shnum, f) != eh.e_shnum)
        goto done;
    const Elf64_Shdr *str = &sh[eh.e_shstrndx];
    names = calloc(1, str->sh_size + 1);
    if (names == NULL || fseek(f, (long)str->sh_offset, SEEK_SET) != 0 ||
        fread(names, 1, str->sh_size, f) != str->sh_size)
        goto done;
    for (unsigned i = 0; i < eh.e_shnum && !found; i++)
        found = sh[i].sh_name < str->sh_size && sh[i].sh_size > 0 &&
                strcmp(names + sh[i].sh_name, ".debug_line") == 0;
done:
    free(names);
    free(sh);
    fclose(f);
    return found;
}

#endif
